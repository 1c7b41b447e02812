"""The tools users run: the ``visualspec`` command line, batch generation with resume and
sharding, and the benchmarks."""
