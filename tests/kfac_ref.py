#!/usr/bin/env python3
"""K-FAC reference in numpy (float64), written from the formulas of
docs/kfac.md, independent of keel's C code: the models' forward and backward
passes, the factors A and G, their zero-debiased EMA, pi, the damped
inverses and the preconditioned update with momentum and KL clipping.

Usage: kfac_ref.py IN.json OUT.txt
IN: the model, the K-FAC settings, the initial variables and per step the
batch (x, labels) and the targets keel drew (the true Fisher's samples).
OUT: lines "<name> <index> v1 v2 ..." after the last step: A, G (debiased
EMA), pi, Ainv, Ginv, precond (F^-1 of the gradient, or of the velocity
with adam momentum) per layer with parameters; delta (the last step's
change of every kernel and bias, in layer order: kernel then bias); clip
(the last step's KL clipping coefficient).
"""
import json
import sys

import numpy as np


def act(name, s):
    if name == "relu":
        return np.maximum(s, 0.0)
    if name == "tanh":
        return np.tanh(s)
    return s


def act_grad(name, a):
    """Derivative from the activation's output."""
    if name == "relu":
        return (a > 0).astype(np.float64)
    if name == "tanh":
        return 1.0 - a * a
    return np.ones_like(a)


def im2col(x, kh, kw):
    """x [n,h,w,c] -> patches [n, oh, ow, kh*kw*c] (valid, stride 1),
    ordered (ky, kx, c) like a [kh,kw,cin,cout] kernel."""
    n, h, w, c = x.shape
    oh, ow = h - kh + 1, w - kw + 1
    p = np.zeros((n, oh, ow, kh, kw, c))
    for ky in range(kh):
        for kx in range(kw):
            p[:, :, :, ky, kx, :] = x[:, ky:ky + oh, kx:kx + ow, :]
    return p.reshape(n, oh, ow, kh * kw * c)


def col2im(dp, shape, kh, kw):
    n, h, w, c = shape
    oh, ow = h - kh + 1, w - kw + 1
    dp = dp.reshape(n, oh, ow, kh, kw, c)
    dx = np.zeros(shape)
    for ky in range(kh):
        for kx in range(kw):
            dx[:, ky:ky + oh, kx:kx + ow, :] += dp[:, :, :, ky, kx, :]
    return dx


def pool_fwd(a):
    """2x2 max-pool, stride 2, valid; returns output and argmax mask."""
    n, h, w, c = a.shape
    oh, ow = h // 2, w // 2
    win = a[:, :oh * 2, :ow * 2, :].reshape(n, oh, 2, ow, 2, c)
    win = win.transpose(0, 1, 3, 5, 2, 4).reshape(n, oh, ow, c, 4)
    idx = np.argmax(win, axis=-1)
    out = np.take_along_axis(win, idx[..., None], axis=-1)[..., 0]
    return out, idx


def pool_bwd(dy, idx, shape):
    n, h, w, c = shape
    oh, ow = dy.shape[1], dy.shape[2]
    dwin = np.zeros((n, oh, ow, c, 4))
    np.put_along_axis(dwin, idx[..., None], dy[..., None], axis=-1)
    dwin = dwin.reshape(n, oh, ow, c, 2, 2).transpose(0, 1, 4, 2, 5, 3)
    dx = np.zeros(shape)
    dx[:, :oh * 2, :ow * 2, :] = dwin.reshape(n, oh * 2, ow * 2, c)
    return dx


class Model:
    """Layers with parameters as dicts; forward records what backward and
    the factors need."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.layers = []
        if cfg["model"] == "cnn":
            self.layers = [("conv", "relu"), ("pool", None),
                           ("conv", "relu"), ("pool", None),
                           ("dense", "relu"), ("dense", None)]
        else:
            self.layers = [("dense", cfg["act"]) for _ in cfg["hidden"]]
            self.layers.append(("dense", None))

    def forward(self, params, x):
        """Returns the logits and per layer with parameters (input, its
        patches for a conv, output activation) plus pool indices."""
        rec = []
        h = x
        pi = 0
        for kind, a in self.layers:
            if kind == "pool":
                shape = h.shape
                h, idx = pool_fwd(h)
                rec.append({"kind": "pool", "idx": idx, "shape": shape})
                continue
            w, b = params[pi]
            pi += 1
            if kind == "conv":
                p = im2col(h, w.shape[0], w.shape[1])
                s = p @ w.reshape(-1, w.shape[3]) + b
                out = act(a, s)
                rec.append({"kind": "conv", "in": h, "patches": p,
                            "out": out, "act": a, "w": w})
            else:
                inp = h.reshape(h.shape[0], -1)
                s = inp @ w + b
                out = act(a, s)
                rec.append({"kind": "dense", "in": inp, "out": out,
                            "act": a, "w": w, "in_shape": h.shape})
            h = out
        return h, rec

    def backward(self, rec, dlogits):
        """Gradients per layer with parameters: (ds per example/location,
        dW, db) for dlogits = dL/dlogits."""
        res = []
        d = dlogits
        for r in reversed(rec):
            if r["kind"] == "pool":
                d = pool_bwd(d, r["idx"], r["shape"])
                continue
            ds = d * act_grad(r["act"], r["out"])
            if r["kind"] == "dense":
                dw = r["in"].T @ ds
                db = ds.sum(axis=0)
                d = (ds @ r["w"].T).reshape(r["in_shape"])
                res.append((ds, dw, db))
            else:
                k = r["patches"].shape[-1]
                pf = r["patches"].reshape(-1, k)
                dsf = ds.reshape(-1, ds.shape[-1])
                dw = (pf.T @ dsf).reshape(r["w"].shape)
                db = dsf.sum(axis=0)
                dp = dsf @ r["w"].reshape(-1, r["w"].shape[3]).T
                d = col2im(dp, r["in"].shape, r["w"].shape[0],
                           r["w"].shape[1])
                res.append((ds, dw, db))
        return list(reversed(res))


def softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def onehot(t, k):
    o = np.zeros((len(t), k))
    o[np.arange(len(t)), t] = 1.0
    return o


def main():
    cfg = json.load(open(sys.argv[1]))
    model = Model(cfg)
    names = cfg["names"]
    shapes = cfg["shapes"]
    vals = [np.array(cfg["vars"][i], dtype=np.float64).reshape(shapes[i])
            for i in range(len(names))]
    params = [(vals[2 * i], vals[2 * i + 1]) for i in range(len(vals) // 2)]
    nl = len(params)
    lam, d = cfg["damping"], cfg["decay"]
    mu, lr, clip_c = cfg["momentum"], cfg["lr"], cfg["norm_constraint"]
    accA = [None] * nl
    accG = [None] * nl
    wsum = 0.0
    vel = [None] * nl
    h, w_, c = cfg["h"], cfg["w"], cfg["c"]
    out = {}
    # the inverses (and pi) of the last step with step % invert_every == 0
    every = cfg.get("invert_every", 1)
    keep = [None] * nl
    for si, step in enumerate(cfg["steps"]):
        x = np.array(step["x"], dtype=np.float64).reshape(-1, h, w_, c)
        y = np.array(step["y"], dtype=np.int64)
        t = np.array(step["t"], dtype=np.int64)
        n = x.shape[0]
        k = cfg["classes"]
        logits, rec = model.forward(params, x)
        p = softmax(logits)
        # the training gradient: mean cross-entropy of the labels
        grads = model.backward(rec, (p - onehot(y, k)) / n)
        # the factors' gradients: sum over examples of -log p(target)
        targets = y if cfg["empirical"] else t
        fgrads = model.backward(rec, p - onehot(targets, k))
        recp = [r for r in rec if r["kind"] != "pool"]
        wsum = d * wsum + (1 - d)
        Ainv, Ginv, pis, locs = [], [], [], []
        for li in range(nl):
            r = recp[li]
            if r["kind"] == "dense":
                a = np.hstack([r["in"], np.ones((n, 1))])
                g = fgrads[li][0]
                T = 1
            else:
                pf = r["patches"].reshape(-1, r["patches"].shape[-1])
                a = np.hstack([pf, np.ones((pf.shape[0], 1))])
                ds = fgrads[li][0]
                g = ds.reshape(-1, ds.shape[-1])
                T = r["patches"].shape[1] * r["patches"].shape[2]
            Ab = a.T @ a / a.shape[0]
            Gb = g.T @ g / g.shape[0]
            accA[li] = Ab * (1 - d) if accA[li] is None else \
                d * accA[li] + (1 - d) * Ab
            accG[li] = Gb * (1 - d) if accG[li] is None else \
                d * accG[li] + (1 - d) * Gb
            A = accA[li] / wsum
            G = accG[li] / wsum
            if si % every == 0:
                ta = np.trace(A) / A.shape[0]
                tg = np.trace(G) / G.shape[0]
                pi = 1.0 if ta * tg == 0 else np.sqrt(ta / tg)
                lt = lam / T
                keep[li] = (
                    np.linalg.inv(A + pi * np.sqrt(lt) * np.eye(A.shape[0])),
                    np.linalg.inv(G + np.sqrt(lt) / pi * np.eye(G.shape[0])),
                    pi)
            Ai, Gi, pi = keep[li]
            Ainv.append(Ai)
            Ginv.append(Gi)
            pis.append(pi)
            locs.append(T)
            out["A %d" % li] = A
            out["G %d" % li] = G
            out["pi %d" % li] = np.array([pi])
            out["Ainv %d" % li] = Ai
            out["Ginv %d" % li] = Gi
        # the update
        V = []
        s = 0.0
        mats = []
        for li in range(nl):
            W, b = params[li]
            gm = np.vstack([grads[li][1].reshape(-1, W.shape[-1]),
                            grads[li][2][None, :]])
            if cfg["momentum_type"] == "adam":
                vel[li] = gm if vel[li] is None else mu * vel[li] + gm
                m = vel[li]
            else:
                m = gm
            P = Ainv[li] @ m @ Ginv[li] / locs[li]
            out["precond %d" % li] = P
            s += float(np.sum(m * P))
            V.append(P)
            mats.append(m)
        coef = 1.0
        if clip_c > 0 and s > 0 and lr > 0:
            coef = min(1.0, np.sqrt(clip_c / (lr * lr * s)))
        out["clip 0"] = np.array([coef])
        newp = []
        for li in range(nl):
            W, b = params[li]
            if cfg["momentum_type"] == "adam":
                upd = lr * coef * V[li]
            else:
                vel[li] = coef * V[li] if vel[li] is None else \
                    mu * vel[li] + coef * V[li]
                upd = lr * vel[li]
            dW = -upd[:-1].reshape(W.shape)
            db = -upd[-1]
            out["delta %d" % (2 * li)] = dW
            out["delta %d" % (2 * li + 1)] = db
            newp.append((W + dW, b + db))
        params = newp
    with open(sys.argv[2], "w") as f:
        for key, v in out.items():
            f.write(key + " " + " ".join("%.17g" % e for e in
                                         np.ravel(v)) + "\n")


if __name__ == "__main__":
    main()
