"""Llama 3.2 3B's shape, for the GPU experiments; no imports, so it loads on a machine with nothing but torch."""

SHAPE = {
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_hidden_layers": 28,
    "num_attention_heads": 24,
    "num_key_value_heads": 8,
    "head_dim": 128,
}
# bf16 (2 bytes a value): key and value, for every layer and KV head
KV_BYTES_PER_TOKEN = 2 * SHAPE["num_hidden_layers"] * SHAPE["num_key_value_heads"] * SHAPE["head_dim"] * 2
