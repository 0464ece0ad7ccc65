"""`llamabatch bench`: the command line around llamabatch.bench."""
