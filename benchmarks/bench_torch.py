"""PyTorch eager side of a workload (CPU, or CUDA with ``device="gpu"``): the same layers, initial weights, data order and optimizer.

The dlrun model is built first (same seed, numpy-drawn weights); each torch module is created
from the built dlrun layer and its weights are copied in.
"""
from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

import bench_dlrun
from workloads import Workload


class Unsupported(Exception):
    """The workload uses a dlrun layer or optimizer this translator does not know."""


def _copy(param, arr):
    t = torch.from_numpy(np.ascontiguousarray(arr)).reshape(param.shape)
    with torch.no_grad():
        param.copy_(t)


class _Recurrent(torch.nn.Module):
    """torch.nn.LSTM / GRU / RNN (batch_first) on a dlrun layer's weights, giving what the dlrun
    layer gives: every state, or the last. Its parameters are also reachable by dlrun's names
    (weight, recurrent, bias, recurrent_bias) for the optimizer; torch's second bias, which the
    LSTM and SimpleRNN do not have, stays 0 outside the optimizer."""

    def __init__(self, layer):
        super().__init__()
        w, u = layer.params["weight"].data, layer.params["recurrent"].data
        kind = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU}.get(type(layer).__name__, torch.nn.RNN)
        self.net = kind(w.shape[1], u.shape[1], batch_first=True, bias="bias" in layer.params)
        _copy(self.net.weight_ih_l0, w)
        _copy(self.net.weight_hh_l0, u)
        self.weight, self.recurrent = self.net.weight_ih_l0, self.net.weight_hh_l0
        if "bias" in layer.params:
            _copy(self.net.bias_ih_l0, layer.params["bias"].data)
            self.bias = self.net.bias_ih_l0
            if "recurrent_bias" in layer.params:  # the GRU's second bias (inside its reset gate)
                _copy(self.net.bias_hh_l0, layer.params["recurrent_bias"].data)
                self.recurrent_bias = self.net.bias_hh_l0
            else:
                with torch.no_grad():
                    self.net.bias_hh_l0.zero_()
                self.net.bias_hh_l0.requires_grad_(False)
        self.sequences = layer.return_sequences

    def forward(self, x):
        out, _ = self.net(x)
        return out if self.sequences else out[:, -1]


def _module(layer, out_shape):
    name = type(layer).__name__
    nn = torch.nn
    if name in ("LSTM", "GRU", "SimpleRNN"):
        return _Recurrent(layer)
    if name == "Linear":
        w = layer.params["weight"].data
        m = nn.Linear(w.shape[1], w.shape[0], bias="bias" in layer.params)
    elif name == "Conv2D":
        w = layer.params["weight"].data
        o, c, kh, kw = w.shape if w.ndim == 4 else (w.shape[0], None, None, None)
        if c is None:
            raise Unsupported("Conv2D weight layout")
        m = nn.Conv2d(c, o, (kh, kw), stride=getattr(layer, "stride", 1), padding=getattr(layer, "padding", 0),
                      dilation=getattr(layer, "dilation", 1), bias="bias" in layer.params)
    elif name == "ReLU":
        return nn.ReLU()
    elif name == "Flatten":
        return nn.Flatten()
    elif name == "MaxPool2D":
        size = next(getattr(layer, a) for a in ("pool_size", "size", "kernel_size") if hasattr(layer, a))
        return nn.MaxPool2d(size, getattr(layer, "stride", None) or size)
    elif name == "Dropout":
        return nn.Dropout(layer.rate if hasattr(layer, "rate") else layer.p)
    else:
        raise Unsupported(f"no torch equivalent for dlrun layer {name}")
    for pname, p in layer.params.items():
        _copy(getattr(m, pname), p.data)
    return m


def _optimizer(opt, model, dl_model, regularizer):
    name = type(opt).__name__
    decay, plain = [], []
    for tm, dl in zip(model, dl_model.layers):
        for pname, p in dl.params.items():
            (decay if regularizer is not None and p.regularize else plain).append(getattr(tm, pname))
    wd = 0.0
    if regularizer is not None:
        if type(regularizer).__name__ != "L2":
            raise Unsupported(f"regularizer {type(regularizer).__name__}")
        wd = 2.0 * regularizer.strength  # dlrun's L2 gradient is 2λw: torch's coupled weight_decay
    groups = [{"params": plain, "weight_decay": 0.0}] + ([{"params": decay, "weight_decay": wd}] if decay else [])
    if name == "SGD":
        return torch.optim.SGD(groups, lr=opt.learning_rate, momentum=opt.momentum, nesterov=opt.nesterov)
    if name == "Adam":
        return torch.optim.Adam(groups, lr=opt.learning_rate, betas=(opt.beta1, opt.beta2), eps=opt.epsilon)
    raise Unsupported(f"optimizer {name}")


def prepare(w: Workload, device: str = "cpu"):
    """Return ``run() -> (wall seconds, CPU seconds, final_loss)``; on CUDA the data is moved once,
    float32 matmuls and convolutions run without TF32 (as CuPy's), and timing synchronizes."""
    trainer, x, y, epochs, cfg = bench_dlrun.build(w)  # host model: weights are drawn on the host anyway
    dl_model = trainer.model
    dev = torch.device("cuda" if device == "gpu" else "cpu")
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    model = torch.nn.Sequential(*[_module(l, s) for l, s in zip(dl_model.layers, dl_model.shapes)]).to(dev)
    regularizer = trainer.training_step.regularized[0][1] if trainer.training_step.regularized else None
    opt = _optimizer(trainer.optimizer, model, dl_model, regularizer)
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(dev)
    yt = torch.from_numpy(y.astype(np.int64)).to(dev)
    n = len(xt)
    bs = n if trainer.batch_size is None else min(trainer.batch_size, n)
    del trainer, dl_model

    def run():
        model.load_state_dict(init)
        opt.state.clear()  # momentum buffers start from zero, as in dlrun
        model.train()
        sync()
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(epochs):
            total = torch.zeros((), dtype=torch.float64, device=dev)
            for s in range(0, n, bs):
                xb, yb = xt[s:s + bs], yt[s:s + bs]
                loss = F.cross_entropy(model(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
                total += loss.detach() * len(xb)
        last = float(total) / n
        sync()
        return time.perf_counter() - t0, time.process_time() - c0, last

    return run
