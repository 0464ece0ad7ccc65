"""`llamabatch config`: the config file and the settings in effect (the file itself and its
layer are the settings layer's: llamabatch/settings/)."""
