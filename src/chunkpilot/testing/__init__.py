"""The test kit: builders and factories the tests (and benchmarks) share; the product never imports it."""
