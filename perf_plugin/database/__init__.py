"""Database layer: directory contract, CSV schema, shape strings, signatures, atomic I/O, lock."""
