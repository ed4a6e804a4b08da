"""How engines run DeepEP today, where moepolicy compares against it (vLLM 0.33.0)."""

# DeepEPAll2AllManagerBase.num_sms (device_communicators/all2all.py): the high-throughput manager
# creates its buffer with 20 SMs, and set_num_sms can only lower it.
VLLM_HT_NUM_SMS = 20
# VLLM_DBO_COMM_SMS's default on CUDA: DeepEP's SMs under dual-batch overlap (the GEMM gets the rest).
VLLM_DBO_COMM_SMS = 20
# deep_ep.Buffer.num_sms, the class default that get_dispatch_config / get_combine_config read.
DEEPEP_DEFAULT_NUM_SMS = 20
