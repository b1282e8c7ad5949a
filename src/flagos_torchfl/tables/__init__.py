"""The vendors' published facts, read from ``data/``: their operator tables (``op_tables``), the
public names of their device modules (``device_modules``), the models of each chip
(``chip_models``), and what names a sim profile and runs natively on it (``profile_specs``)."""
