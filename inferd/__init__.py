"""inferd: a multi-model inference server speaking the KServe v2 / Triton protocol."""
