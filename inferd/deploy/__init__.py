"""Running inferd behind a load balancer: an Envoy configuration (``envoy``). The local fleet of
replicas behind a real Envoy that tests and benchmarks run is a harness, outside the package:
``bench/replicas.py``."""
