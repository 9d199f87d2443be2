"""The bottom layer: vocabulary every other layer shares (expressions, views, dtypes, Winograd math).

It imports nothing from ember; ops, backends, the planner and the model all build on it.
"""
