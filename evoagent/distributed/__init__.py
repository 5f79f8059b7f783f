"""Spreading the search's evaluations over a Ray cluster (``evoagent run --ray``)."""
