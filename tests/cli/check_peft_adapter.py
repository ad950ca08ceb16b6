#!/usr/bin/env python3
"""Checks a PEFT folder that `hadatrain convert --adapter --dtype fp32` wrote against the LoRA checkpoint it came from,
with the standard library alone (no torch, no safetensors package): adapter_config.json holds what peft's LoraConfig
needs, adapter_model.safetensors holds every lora_A / lora_B tensor of the checkpoint's model.safetensors under
"base_model.model.<name>", with its shape, dtype and bytes unchanged, and nothing else; hadatrain_provenance.json names
the checkpoint.

    check_peft_adapter.py ADAPTER_DIR CHECKPOINT_STEP_DIR RANK ALPHA
"""
import json
import struct
import sys


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__", None)
    body = data[8 + n :]
    return {k: (v["dtype"], v["shape"], body[v["data_offsets"][0] : v["data_offsets"][1]]) for k, v in header.items()}


def main():
    adapter, checkpoint, rank, alpha = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    with open(f"{adapter}/adapter_config.json") as f:
        cfg = json.load(f)
    expected = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha, "bias": "none",
                "fan_in_fan_out": False, "inference_mode": True, "modules_to_save": None, "use_rslora": False}
    for key, value in expected.items():
        if cfg.get(key) != value:
            sys.exit(f"FAIL: adapter_config.json: {key} is {cfg.get(key)!r}, expected {value!r}")
    if not isinstance(cfg.get("target_modules"), list) or not cfg["target_modules"]:
        sys.exit(f"FAIL: adapter_config.json: target_modules is {cfg.get('target_modules')!r}")
    if "base_model_name_or_path" not in cfg:
        sys.exit("FAIL: adapter_config.json has no base_model_name_or_path")

    ours = read_safetensors(f"{checkpoint}/model.safetensors")
    peft = read_safetensors(f"{adapter}/adapter_model.safetensors")
    adapters = {k: v for k, v in ours.items() if k.endswith(".lora_A.weight") or k.endswith(".lora_B.weight")}
    if not adapters:
        sys.exit(f"FAIL: {checkpoint} holds no adapters")
    want = {"base_model.model." + k: v for k, v in adapters.items()}
    if set(peft) != set(want):
        sys.exit(f"FAIL: keys differ: missing {sorted(set(want) - set(peft))[:3]}, extra {sorted(set(peft) - set(want))[:3]}")
    for key, (dtype, shape, raw) in want.items():
        if peft[key] != (dtype, shape, raw):
            sys.exit(f"FAIL: {key}: {peft[key][:2]} vs the checkpoint's {(dtype, shape)}, or other bytes")
        if key.endswith(".lora_A.weight") and shape[0] != rank or key.endswith(".lora_B.weight") and shape[1] != rank:
            sys.exit(f"FAIL: {key} has shape {shape}: lora_A is (r, in), lora_B (out, r)")

    with open(f"{adapter}/hadatrain_provenance.json") as f:
        prov = json.load(f)
    if not prov.get("checkpoint", "").endswith(checkpoint.rstrip("/").split("/")[-1]) or "peft_adapter" not in prov:
        sys.exit(f"FAIL: hadatrain_provenance.json: {prov}")
    print(f"ok: {len(want)} adapter tensors bit for bit, r {rank}, lora_alpha {alpha:g}")


main()
