#!/usr/bin/env python3
"""PyTorch's own torch.multiprocessing example (docs: "Multiprocessing best
practices", sharing CUDA tensors: the producer sends tensors and waits, the
consumer uses them and sets an event), with one line added: the
gpubuf.torch.install() call. Tensors then travel through gpubufd: the
producer could free them or exit at once, a consumer that crashes leaves
nothing behind, and no torch.cuda.ipc_collect() is needed.

    GPUBUF_SOCKET=/tmp/g.sock python3 torch_queue.py

Without CUDA the same runs on CPU tensors through a host pool.
"""
import torch
import torch.multiprocessing as mp

import gpubuf.torch

device = "cuda" if torch.cuda.is_available() else "cpu"


def consumer(queue, event):
    # receive tensors and use them
    x = queue.get()
    total = x.sum().item()
    print("consumer got", tuple(x.shape), x.device, "sum", total)
    ok = total == x.numel()  # the producer's ones, every one of them
    del x
    event.set()
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    gpubuf.torch.install(cpu=(device == "cpu"))  # the one added line
    mp.set_start_method("spawn")
    queue = mp.Queue()
    event = mp.Event()
    p = mp.Process(target=consumer, args=(queue, event))
    p.start()
    # send tensors, do something
    x = torch.ones(1024, 1024, device=device)
    queue.put(x)
    event.wait()
    p.join()
    print("producer done, consumer exit code", p.exitcode)
    raise SystemExit(p.exitcode)
