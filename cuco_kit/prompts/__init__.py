"""Prompt templates, one file each; load with cuco_kit.prompts.load(name)."""
