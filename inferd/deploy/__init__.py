"""Running inferd behind a load balancer: an Envoy configuration (``envoy``) and a local
fleet of replicas behind a real Envoy for tests and benchmarks (``replicas``)."""
