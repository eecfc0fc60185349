"""Loops without a framework: ``perfhooks.profile`` and the session it shares with the integrations."""
