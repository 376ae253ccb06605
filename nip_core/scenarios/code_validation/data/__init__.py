"""Shipped data of the code-validation scenario (a package so that setuptools ships the files)."""
