"""Queries and rules. Route handlers parse, call one function here with keyword arguments, and render."""
