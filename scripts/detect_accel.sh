#!/usr/bin/env bash
# Print which jax flavour this machine wants: cpu, cuda12 or cuda13.
# An NVIDIA driver >= 580 runs CUDA 13 wheels; an older one gets CUDA 12; no driver: cpu.
set -u
if command -v nvidia-smi >/dev/null 2>&1; then
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1)
  major=${driver%%.*}
  if [[ "$major" =~ ^[0-9]+$ ]]; then
    if [ "$major" -ge 580 ]; then echo cuda13; else echo cuda12; fi
    exit 0
  fi
fi
echo cpu
