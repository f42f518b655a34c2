"""Evaluation: measure lip-sync of any video from the video alone."""
