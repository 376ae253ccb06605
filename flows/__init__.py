"""Prefect flows of nipflow (and the ``nipflow`` command in ``flows.cli``)."""
