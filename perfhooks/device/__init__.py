"""All access to the accelerator: the clocks that time phases (host or device events) and the device's
description. Nothing else in perfhooks calls ``torch.cuda`` for timing."""
