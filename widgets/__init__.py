"""Notebook widgets (installed as cuco_kit.widgets)."""
