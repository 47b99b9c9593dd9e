"""A grid of replays (`sweep`): its points run by an executor (`executors`: local
worker processes or Ray tasks), and skipped when the fingerprint of their
inputs is unchanged (`fingerprint`)."""
