"""What perfhooks installs on torch and on the user's objects: module and optimizer hooks, instance patches, host batch
counting."""
