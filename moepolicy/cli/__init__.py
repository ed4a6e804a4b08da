"""The ``moepolicy`` command line: one module per subcommand, registered in ``main._COMMANDS``."""
