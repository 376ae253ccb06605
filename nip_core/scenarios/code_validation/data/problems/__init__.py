"""YAML problem bank (a package so that setuptools ships the files)."""
