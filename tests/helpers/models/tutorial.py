"""The tutorial's classes, copied verbatim from ``shared/seed`` (its missing
``import torch.nn.functional as F`` included), finished the way a reader would: an
embedding, a causal mask from ``torch.tril``, a stack of ``DecoderBlock`` and a head.

Tracing :class:`TutorialLM` fails in ``F.softmax`` with a ``NameError``: the tutorial's
bug, kept on purpose. ``tutorial_fixed.py`` is the same file with the import added.
This file is excluded from ruff (it is the tutorial's text, trailing spaces and all).
"""

import torch
import torch.nn as nn
import math

def scaled_dot_product_attention(q, k, v, mask=None):
    # q, k, v shape: (batch_size, num_heads, seq_len, d_head)
    d_k = q.size(-1)
    
    # Matmul for scores: (..., seq_len, d_head) @ (..., d_head, seq_len) -> (..., seq_len, seq_len)
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d_k)
    
    # Apply mask if provided
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9) # -1e9 is equivalent to -infinity
        
    # Softmax to get attention weights
    attention_weights = F.softmax(scores, dim=-1)
    
    # Matmul weights with values
    # (..., seq_len, seq_len) @ (..., seq_len, d_head) -> (..., seq_len, d_head)
    output = torch.matmul(attention_weights, v)
    
    return output, attention_weights

class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        assert d_model % num_heads == 0
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_head = d_model // num_heads
        
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)
        
    def split_heads(self, x, batch_size):
        # Reshape from (batch_size, seq_len, d_model) to (batch_size, num_heads, seq_len, d_head)
        x = x.view(batch_size, -1, self.num_heads, self.d_head)
        return x.transpose(1, 2)
        
    def forward(self, q, k, v, mask):
        batch_size = q.size(0)
        
        # 1. Project Q, K, V
        q = self.W_q(q)
        k = self.W_k(k)
        v = self.W_v(v)
        
        # 2. Split into heads
        q = self.split_heads(q, batch_size)
        k = self.split_heads(k, batch_size)
        v = self.split_heads(v, batch_size)
        
        # 3. Apply scaled dot-product attention
        attention_output, _ = scaled_dot_product_attention(q, k, v, mask)
        
        # 4. Concatenate heads and project
        attention_output = attention_output.transpose(1, 2).contiguous().view(batch_size, -1, self.d_model)
        output = self.W_o(attention_output)
        
        return output

class PositionWiseFeedForward(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.linear2(self.relu(self.linear1(x)))

class DecoderBlock(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, dropout=0.1):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.feed_forward = PositionWiseFeedForward(d_model, d_ff)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        
    def forward(self, x, mask):
        # Pre-LN implementation
        
        # Self-attention sub-layer
        norm_x = self.norm1(x)
        attn_output = self.self_attn(norm_x, norm_x, norm_x, mask)
        x = x + self.dropout(attn_output) # Residual connection
        
        # Feed-forward sub-layer
        norm_x = self.norm2(x)
        ff_output = self.feed_forward(norm_x)
        x = x + self.dropout(ff_output) # Residual connection
        
        return x


# --- the reader's completion: embeddings, mask, stack, head


class TutorialLM(nn.Module):
    def __init__(self, vocab_size=256, d_model=32, num_heads=4, d_ff=128, num_layers=2, max_len=64):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(
            [DecoderBlock(d_model, num_heads, d_ff) for _ in range(num_layers)]
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, idx):
        batch_size, seq_len = idx.shape
        positions = torch.arange(seq_len, device=idx.device)
        x = self.token_embedding(idx) + self.position_embedding(positions)
        mask = torch.tril(torch.ones(seq_len, seq_len, device=idx.device))  # 1: may attend
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))  # (batch_size, seq_len, vocab_size)


def example_inputs():
    torch.manual_seed(0)
    return torch.randint(0, 256, (2, 10))
