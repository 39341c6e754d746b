"""Factories shared by the worker and app tests."""
