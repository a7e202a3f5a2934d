"""Tooling for the serve-system lab: model artifacts, the local serving stack and its processes."""
