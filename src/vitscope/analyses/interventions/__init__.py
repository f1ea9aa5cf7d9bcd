"""Analyses that read a model through its own parts or edit it: the logit lens and head importance."""
