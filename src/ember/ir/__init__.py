"""Typed graph IR shared by the importer, the optimiser and the planner."""

from .graph import Dim, Graph, Node, Shape, ValueInfo

__all__ = ["Dim", "Graph", "Node", "Shape", "ValueInfo"]
