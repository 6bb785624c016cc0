"""The programs tools/capture_trace.py can run under the profiler.

Each workload is a small, real PyTorch program of one model family.  It is
built in two phases, so that only what a GPU run would allocate on the
device is captured:

* ``__init__(torch, args)`` -- host-side setup, outside the capture: the
  model with its weights, a host dataset, and the per-step plan drawn from
  ``--seed`` (so a capture is deterministic);
* inside the capture: ``start(model)`` with the model already moved "to the
  device" (optimizer state is created there), ``step(i, optimizer_step)``
  once per step, and ``teardown()`` which drops every reference so that
  every allocation gets its free.

``step`` returns a short description of the step and a float (the loss, or
another figure for inference) for the progress log.  Training workloads
call ``optimizer_step(optimizer)`` so that the capture can mark the
optimizer's allocations.

Workloads (``--workload``):

gpt        decoder transformer, sequence length drawn per step from
           [--min-seq-len, --max-seq-len] (equal bounds: fixed length)
cnn        convolutional classifier, batch size drawn per step from
           [--min-batch, --max-batch] (equal bounds: fixed batch)
moe        decoder whose feed-forward layers are top-1 routed mixtures of
           experts: the tokens each expert gets depend on the data
kv-server  inference server: requests arrive and finish at random, each
           keeps a key/value cache per layer that grows by one token per
           decode step (torch.cat, as simple serving loops do)
detect     dense-prediction (detection/segmentation-style) network whose
           input images change size every step: height and width drawn
           independently from multiples of 32 in [--min-image,
           --max-image] (a batch is padded to one size, as detection
           loaders do), batch size drawn from [--min-batch, --max-batch]
"""

import math
import random

WORKLOADS = ("gpt", "cnn", "moe", "kv-server", "detect")


def make_workload(torch, args, gpt_classes):
    """The workload named by args.workload, with its host-side setup done."""
    kind = {"gpt": GptTraining, "cnn": CnnTraining, "moe": MoeTraining,
            "kv-server": KvCacheServer,
            "detect": DetectionTraining}[args.workload]
    return kind(torch, args, gpt_classes)


def make_corpus(torch, vocab_size, seed, n_tokens=200000):
    """A learnable synthetic corpus: random choices among a fixed set of
    random token phrases.  Built before the capture starts, so its
    allocations are not part of the trace (like a dataset on the host)."""
    rng = random.Random(seed + 1)
    phrases = [[rng.randrange(vocab_size) for _ in range(rng.randint(3, 12))]
               for _ in range(512)]
    tokens = []
    while len(tokens) < n_tokens:
        tokens.extend(phrases[rng.randrange(len(phrases))])
    return torch.tensor(tokens[:n_tokens], dtype=torch.long)


class GptTraining:
    """A small GPT trained with Adam; the sequence length changes per step."""
    architecture = "gpt"

    def __init__(self, torch, args, gpt_classes):
        self.torch = torch
        self.args = args
        self.corpus = make_corpus(torch, args.vocab_size, args.seed)
        self.model = gpt_classes.GPT(
            args.vocab_size, args.max_seq_len, args.n_layer, args.n_head,
            args.d_model, args.mlp_ratio, args.tie_weights)
        rng = random.Random(args.seed)
        self.plan = []
        for _ in range(args.steps):
            t = rng.randint(args.min_seq_len, args.max_seq_len)
            offs = [rng.randrange(len(self.corpus) - t - 1)
                    for _ in range(args.batch_size)]
            self.plan.append((t, offs))

    def start(self, model):
        self.model = model
        self.optimizer = self.torch.optim.Adam(
            model.parameters(), lr=self.args.lr, foreach=self.args.foreach)
        model.train()

    def step(self, i, optimizer_step):
        torch = self.torch
        t, offs = self.plan[i]
        x = torch.stack([self.corpus[o:o + t] for o in offs])
        y = torch.stack([self.corpus[o + 1:o + 1 + t] for o in offs])
        _, loss = self.model(x, y)
        loss.backward()
        optimizer_step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        return "seq_len {:4d}".format(t), loss.item()

    def teardown(self):
        self.optimizer = None
        self.model = None


def build_convnet(torch, width, n_classes):
    """A ResNet-flavoured stack: stem, four stages that halve the resolution
    and double the width, global pooling, a linear classifier."""
    nn = torch.nn
    layers = [nn.Conv2d(3, width, 3, padding=1, bias=False),
              nn.BatchNorm2d(width), nn.ReLU()]
    w = width
    for _ in range(4):
        layers += [nn.Conv2d(w, 2 * w, 3, stride=2, padding=1, bias=False),
                   nn.BatchNorm2d(2 * w), nn.ReLU(),
                   nn.Conv2d(2 * w, 2 * w, 3, padding=1, bias=False),
                   nn.BatchNorm2d(2 * w), nn.ReLU()]
        w *= 2
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(w, n_classes)]
    return nn.Sequential(*layers)


class CnnTraining:
    """An image classifier trained with SGD + momentum; the batch size is
    drawn per step (a fixed batch when --min-batch == --max-batch)."""
    architecture = "cnn"

    def __init__(self, torch, args, gpt_classes):
        del gpt_classes
        self.torch = torch
        self.args = args
        g = torch.Generator().manual_seed(args.seed + 2)
        n = 256
        self.images = torch.randn(n, 3, args.image_size, args.image_size,
                                  generator=g)
        self.labels = torch.randint(0, 10, (n,), generator=g)
        self.model = build_convnet(torch, args.cnn_width, 10)
        rng = random.Random(args.seed)
        self.plan = []
        for _ in range(args.steps):
            b = rng.randint(args.min_batch, args.max_batch)
            self.plan.append([rng.randrange(n) for _ in range(b)])

    def start(self, model):
        self.model = model
        self.optimizer = self.torch.optim.SGD(
            model.parameters(), lr=0.01, momentum=0.9,
            foreach=self.args.foreach)
        model.train()

    def step(self, i, optimizer_step):
        torch = self.torch
        idx = self.plan[i]
        x = torch.stack([self.images[j] for j in idx])
        y = torch.stack([self.labels[j] for j in idx])
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        optimizer_step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        return "batch {:4d}".format(len(idx)), loss.item()

    def teardown(self):
        self.optimizer = None
        self.model = None


def build_moe_model(torch, gpt_classes, args):
    nn = torch.nn
    F = torch.nn.functional

    class Expert(nn.Module):
        def __init__(self, d, ratio):
            super().__init__()
            self.fc = nn.Linear(d, ratio * d)
            self.proj = nn.Linear(ratio * d, d)

        def forward(self, x):
            return self.proj(F.gelu(self.fc(x)))

    class MoE(nn.Module):
        """Top-1 routing: each token goes to the expert its gate scores
        highest, scaled by the gate's probability (Switch-style)."""

        def __init__(self, d, ratio, n_experts):
            super().__init__()
            self.gate = nn.Linear(d, n_experts, bias=False)
            self.experts = nn.ModuleList(
                [Expert(d, ratio) for _ in range(n_experts)])

        def forward(self, x):
            b, t, c = x.size()
            flat = x.reshape(b * t, c)
            probs = F.softmax(self.gate(flat), dim=-1)
            top = probs.argmax(dim=-1)
            out = torch.zeros_like(flat)
            for e, expert in enumerate(self.experts):
                idx = (top == e).nonzero().squeeze(1)
                if idx.numel() == 0:
                    continue
                ye = expert(flat.index_select(0, idx))
                out = out.index_add(0, idx, ye * probs[idx, e].unsqueeze(1))
            return out.view(b, t, c)

    class Block(nn.Module):
        def __init__(self, d, n_head, ratio, max_len, n_experts):
            super().__init__()
            self.ln_1 = nn.LayerNorm(d)
            self.attn = gpt_classes.CausalSelfAttention(d, n_head, max_len)
            self.ln_2 = nn.LayerNorm(d)
            self.moe = MoE(d, ratio, n_experts)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.moe(self.ln_2(x))

    class MoeLM(nn.Module):
        def __init__(self):
            super().__init__()
            d = args.d_model
            self.wte = nn.Embedding(args.vocab_size, d)
            self.wpe = nn.Embedding(args.max_seq_len, d)
            self.h = nn.ModuleList(
                [Block(d, args.n_head, args.mlp_ratio, args.max_seq_len,
                       args.n_experts) for _ in range(args.n_layer)])
            self.ln_f = nn.LayerNorm(d)
            self.lm_head = nn.Linear(d, args.vocab_size, bias=False)

        def forward(self, idx, targets):
            t = idx.size(1)
            pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)),
                                   targets.view(-1))
            return logits, loss

    return MoeLM()


def build_dense_head_net(torch, width, n_classes):
    """A fully convolutional detector-like network: a stem and three stages
    (stride 8 overall), then a 3x3 head and a 1x1 classifier per location
    (the per-anchor score map of a one-stage detector)."""
    nn = torch.nn
    layers = [nn.Conv2d(3, width, 3, padding=1, bias=False),
              nn.BatchNorm2d(width), nn.ReLU()]
    w = width
    for _ in range(3):
        layers += [nn.Conv2d(w, 2 * w, 3, stride=2, padding=1, bias=False),
                   nn.BatchNorm2d(2 * w), nn.ReLU()]
        w *= 2
    layers += [nn.Conv2d(w, w, 3, padding=1), nn.ReLU(),
               nn.Conv2d(w, n_classes, 1)]
    return nn.Sequential(*layers)


class DetectionTraining:
    """Dense prediction on images whose size changes per step: each step a
    batch of (height, width) drawn from multiples of 32, every location of
    the stride-8 score map classified (cross-entropy), SGD + momentum."""
    architecture = "detect"

    def __init__(self, torch, args, gpt_classes):
        del gpt_classes
        self.torch = torch
        self.args = args
        self.model = build_dense_head_net(torch, args.cnn_width, 8)
        rng = random.Random(args.seed)
        sizes = list(range(args.min_image, args.max_image + 1, 32))
        self.plan = []
        for _ in range(args.steps):
            self.plan.append((rng.randint(args.min_batch, args.max_batch),
                              rng.choice(sizes), rng.choice(sizes),
                              rng.randrange(1 << 30)))

    def start(self, model):
        self.model = model
        self.optimizer = self.torch.optim.SGD(
            model.parameters(), lr=0.01, momentum=0.9,
            foreach=self.args.foreach)
        model.train()

    def step(self, i, optimizer_step):
        torch = self.torch
        b, h, w, seed = self.plan[i]
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(b, 3, h, w, generator=g)
        y = torch.randint(0, 8, (b, h // 8, w // 8), generator=g)
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        optimizer_step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        return "batch {:3d} {:4d}x{:<4d}".format(b, h, w), loss.item()

    def teardown(self):
        self.optimizer = None
        self.model = None


class MoeTraining(GptTraining):
    """A decoder with mixture-of-experts feed-forward layers, fixed shapes in
    and out; the expert batch sizes change with the routing."""
    architecture = "moe"

    def __init__(self, torch, args, gpt_classes):
        super().__init__(torch, args, gpt_classes)
        self.model = build_moe_model(torch, gpt_classes, args)


class KvCacheServer:
    """Greedy decoding for a stream of requests with a GPT's weights.  A step
    admits the requests that arrived (prefill: the prompt through every
    layer, keeping its keys and values), then decodes one token for every
    active request, growing each cache by torch.cat; a request that has
    produced its tokens leaves and its caches are freed."""
    architecture = "kv-server"

    def __init__(self, torch, args, gpt_classes):
        self.torch = torch
        self.args = args
        self.model = gpt_classes.GPT(
            args.vocab_size, args.max_seq_len, args.n_layer, args.n_head,
            args.d_model, args.mlp_ratio, args.tie_weights)
        rng = random.Random(args.seed)
        self.plan = []  # per step: [(prompt tokens, tokens to generate)]
        for _ in range(args.steps):
            arrivals = []
            for _ in range(args.max_arrivals):
                if rng.random() < args.arrival_rate / args.max_arrivals:
                    p = rng.randint(args.min_seq_len,
                                    max(args.min_seq_len,
                                        args.max_seq_len // 2))
                    g = rng.randint(1, args.max_seq_len - p)
                    arrivals.append(([rng.randrange(args.vocab_size)
                                      for _ in range(p)], g))
            self.plan.append(arrivals)
        self.active = []  # [last token, tokens left, [(k, v)] per layer]

    def start(self, model):
        self.model = model
        model.eval()

    def _attend(self, block, x, cache, causal):
        """One block on x (1, t, c); cache is None (prefill) or (k, v)."""
        torch = self.torch
        attn = block.attn
        b, t, c = x.size()
        hs = c // attn.n_head
        q, k, v = attn.c_attn(block.ln_1(x)).split(c, dim=2)
        q = q.view(b, t, attn.n_head, hs).transpose(1, 2)
        k = k.view(b, t, attn.n_head, hs).transpose(1, 2)
        v = v.view(b, t, attn.n_head, hs).transpose(1, 2)
        if cache is not None:
            k = torch.cat([cache[0], k], dim=2)
            v = torch.cat([cache[1], v], dim=2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        if causal:
            att = att.masked_fill(attn.mask[:, :, :t, :t] == 0, float("-inf"))
        y = torch.softmax(att, dim=-1) @ v
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        x = x + attn.c_proj(y)
        x = x + block.mlp(block.ln_2(x))
        return x, (k, v)

    def _forward(self, tokens, caches, start_pos):
        torch = self.torch
        m = self.model
        idx = torch.tensor([tokens], dtype=torch.long)
        pos = torch.arange(start_pos, start_pos + len(tokens),
                           dtype=torch.long)
        x = m.wte(idx) + m.wpe(pos)
        new = []
        for li, block in enumerate(m.h):
            x, kv = self._attend(block, x, caches[li] if caches else None,
                                 causal=caches is None)
            new.append(kv)
        logits = m.lm_head(m.ln_f(x[:, -1, :]))
        return int(logits.argmax(dim=-1).item()), new

    def step(self, i, optimizer_step):
        del optimizer_step
        with self.torch.no_grad():
            for prompt, n_gen in self.plan[i]:
                token, caches = self._forward(prompt, None, 0)
                self.active.append([token, n_gen, caches, len(prompt)])
            still = []
            for req in self.active:
                token, left, caches, pos = req
                token, caches = self._forward([token], caches, pos)
                left -= 1
                if left > 0:
                    still.append([token, left, caches, pos + 1])
            self.active = still
        tokens = sum(r[3] for r in self.active)
        return "active {:3d}".format(len(self.active)), float(tokens)

    def teardown(self):
        self.active = []
        self.model = None
