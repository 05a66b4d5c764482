"""Kernel replays: one OpReplay per kernel type, looked up through the registry."""
