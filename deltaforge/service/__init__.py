"""The running service: the pipelines ``serve`` manages, and those created over REST."""
