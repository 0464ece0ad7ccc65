"""`llamabatch chat`: the command line and the terminal around llamabatch.chat."""
