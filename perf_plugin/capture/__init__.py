"""Recording, in a real model run, what a kernel's time depends on beyond its shapes."""

from perf_plugin.capture.execution_trace import execution_trace_observer
from perf_plugin.capture.input_values import WATCHED, InputValueCapture, Watched, capture_input_values

__all__ = ["WATCHED", "InputValueCapture", "Watched", "capture_input_values", "execution_trace_observer"]
