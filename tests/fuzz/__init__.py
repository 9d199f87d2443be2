"""Fuzzing of model loading and feeds (project issue 21): hypothesis generates the cases, a subprocess runs them."""
