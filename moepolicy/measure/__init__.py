"""Live measurement on GPUs: CUDA-event timing and the DeepEP operations a tuner or benchmark times."""
