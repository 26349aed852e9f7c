"""Preparing the data: conversations from your logs, KdConv, the splits and the warm-up set."""
