"""Example frame processors (plug-ins, see :mod:`pipeline.processor`); not loaded unless
configured in ``[pipeline] processors``."""
