"""Procedural worlds with exactly checkable images (used to train and evaluate the shipped models)."""
