"""What can be known without timing: the cost model (``iomodel``: FLOPs, bytes, rooflines, occupancy,
the GPU table of datasheet figures) and the compiler's report (``compiled``: registers, spills and
serialised matrix products that ptxas reports for the H100, on any machine). Timed results live in
``attnkit.bench``.
"""
