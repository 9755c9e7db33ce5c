"""Benchmarks behind ``mate-mamba bench ssu|ssd``: a CUDA-graph replay timer (``timing``), a report writer
(``report``: JSON + markdown + PNG) and the shape registry (``shapes``)."""
