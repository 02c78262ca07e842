// refllama: llama.cpp's own answer for a forward pass, as JSON, so ferrox's
// forward pass can be compared with it without llama.cpp at test time.
//
// Key decision: every llama.cpp setting that could change a logit is either
// left at llama.cpp's default and *recorded* in the output (flash attention,
// KV cache types, repacking) or set explicitly from the command line (context,
// batch, threads). Greedy selection is done here, not by a llama.cpp sampler,
// so the tie rule (lowest id wins) is ours and written down.
//
// usage: refllama MODEL (--prompt TEXT | --tokens 1,2,3) [--n-predict N]
//                 [--top-k K] [--all-logits] [--ctx C] [--threads T]
//                 [--no-repack]
// JSON goes to stdout; llama.cpp's log goes to stderr.

#include "llama.h"
#include "ggml.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

// ---- SHA-256 (FIPS 180-4), so the JSON names the exact model bytes ----------

struct Sha256 {
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    uint8_t buf[64];
    size_t buf_len = 0;
    uint64_t total = 0;

    static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

    void block(const uint8_t * p) {
        static const uint32_t k[64] = {
            0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
            0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
            0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
            0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
            0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
            0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
            0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
            0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
        uint32_t w[64];
        for (int i = 0; i < 16; ++i) {
            w[i] = (uint32_t(p[4 * i]) << 24) | (uint32_t(p[4 * i + 1]) << 16) |
                   (uint32_t(p[4 * i + 2]) << 8) | uint32_t(p[4 * i + 3]);
        }
        for (int i = 16; i < 64; ++i) {
            uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
            uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16] + s0 + w[i - 7] + s1;
        }
        uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
        for (int i = 0; i < 64; ++i) {
            uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
            uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
            hh = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
        }
        h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
    }

    void update(const uint8_t * p, size_t n) {
        total += n;
        while (n > 0) {
            size_t take = std::min(n, sizeof(buf) - buf_len);
            memcpy(buf + buf_len, p, take);
            buf_len += take; p += take; n -= take;
            if (buf_len == 64) { block(buf); buf_len = 0; }
        }
    }

    std::string hex() {
        uint64_t bits = total * 8;
        uint8_t pad = 0x80;
        update(&pad, 1);
        uint8_t zero = 0;
        while (buf_len != 56) { update(&zero, 1); }
        uint8_t len[8];
        for (int i = 0; i < 8; ++i) { len[i] = uint8_t(bits >> (56 - 8 * i)); }
        update(len, 8);
        std::string out;
        char tmp[9];
        for (uint32_t v : h) { snprintf(tmp, sizeof(tmp), "%08x", v); out += tmp; }
        return out;
    }
};

bool sha256_file(const char * path, std::string & out) {
    std::ifstream f(path, std::ios::binary);
    if (!f) { return false; }
    Sha256 s;
    std::vector<char> chunk(1 << 20);
    while (f) {
        f.read(chunk.data(), chunk.size());
        s.update(reinterpret_cast<const uint8_t *>(chunk.data()), size_t(f.gcount()));
    }
    out = s.hex();
    return true;
}

// ---- JSON output ------------------------------------------------------------

// Invalid UTF-8 becomes U+FFFD so the document always parses; the token ids,
// not this text, are the reference.
std::string json_str(const std::string & s) {
    std::string o = "\"";
    size_t i = 0;
    while (i < s.size()) {
        unsigned char c = s[i];
        int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
        bool ok = len > 0 && i + len <= s.size();
        for (int j = 1; ok && j < len; ++j) { ok = (static_cast<unsigned char>(s[i + j]) >> 6) == 0x2; }
        if (!ok) { o += "\\ufffd"; ++i; continue; }
        if (len > 1) { o.append(s, i, len); i += len; continue; }
        switch (c) {
            case '"':  o += "\\\""; break;
            case '\\': o += "\\\\"; break;
            case '\n': o += "\\n"; break;
            case '\r': o += "\\r"; break;
            case '\t': o += "\\t"; break;
            default:
                if (c < 0x20 || c == 0x7f) {
                    char tmp[8];
                    snprintf(tmp, sizeof(tmp), "\\u%04x", c);
                    o += tmp;
                } else {
                    o += char(c);
                }
        }
        ++i;
    }
    return o + "\"";
}

// %.9g round-trips every float32 exactly, so the JSON loses nothing.
std::string json_f32(float v) {
    char tmp[32];
    snprintf(tmp, sizeof(tmp), "%.9g", double(v));
    return tmp;
}

// ---- llama.cpp log capture ----------------------------------------------------

std::vector<std::string> g_log;

void log_cb(ggml_log_level level, const char * text, void *) {
    (void) level;
    fputs(text, stderr);
    g_log.emplace_back(text);
}

// All of llama.cpp's log as one list of lines (its messages arrive in pieces).
std::vector<std::string> log_lines() {
    std::string all;
    for (auto & s : g_log) { all += s; }
    std::vector<std::string> out;
    size_t start = 0;
    while (start < all.size()) {
        size_t end = all.find('\n', start);
        if (end == std::string::npos) { end = all.size(); }
        out.push_back(all.substr(start, end - start));
        start = end + 1;
    }
    return out;
}

// The lines that say what llama.cpp actually resolved (context sizes, flash
// attention "auto", the KV cache types, repacked buffers), kept verbatim.
std::vector<std::string> settings_log_lines() {
    static const char * prefixes[] = {"llama_context:", "llama_kv_cache", "resolve_fused_ops:",
                                      "load_tensors:   CPU_REPACK", "done_getting_tensors:"};
    std::vector<std::string> out;
    for (auto & line : log_lines()) {
        if (line.find(": layer ") != std::string::npos) { continue; }  // per-layer placement noise
        for (const char * p : prefixes) {
            if (line.rfind(p, 0) == 0) { out.push_back(line); break; }
        }
    }
    return out;
}

// Repacked weights run a different (interleaved) kernel than the file's
// block format suggests; which ones is part of "what llama.cpp computed".
std::vector<std::string> repacked_tensors() {
    static const std::string marker = "repack tensor ";
    std::vector<std::string> out;
    for (auto & line : log_lines()) {
        size_t at = line.find(marker);
        if (at != std::string::npos) { out.push_back(line.substr(at + marker.size())); }
    }
    return out;
}

std::string flash_attn_resolved() {
    for (auto & s : g_log) {
        if (s.find("Flash Attention enabled") != std::string::npos) { return "enabled"; }
        if (s.find("Flash Attention not supported") != std::string::npos) { return "disabled"; }
    }
    return "unknown";
}

// ---- the run ------------------------------------------------------------------

[[noreturn]] void die(const std::string & msg) {
    fprintf(stderr, "refllama: %s\n", msg.c_str());
    exit(1);
}

int parse_int(const char * flag, const char * v) {
    char * end = nullptr;
    long x = strtol(v, &end, 10);
    if (end == v || *end != '\0' || x < 0 || x > 1 << 30) { die(std::string("bad value for ") + flag + ": " + v); }
    return int(x);
}

// Ties go to the lowest id: the first maximum in id order.
int argmax(const float * v, int n) {
    int best = 0;
    for (int i = 1; i < n; ++i) {
        if (v[i] > v[best]) { best = i; }
    }
    return best;
}

std::vector<int> top_k(const float * v, int n, int k) {
    std::vector<int> ids(n);
    for (int i = 0; i < n; ++i) { ids[i] = i; }
    k = std::min(k, n);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int a, int b) {
        return v[a] != v[b] ? v[a] > v[b] : a < b;
    });
    ids.resize(k);
    return ids;
}

std::string logits_row(const float * v, int n) {
    std::string o = "[";
    for (int i = 0; i < n; ++i) {
        if (i) { o += ","; }
        o += json_f32(v[i]);
    }
    return o + "]";
}

}  // namespace

int main(int argc, char ** argv) {
    const char * model_path = nullptr;
    std::string prompt;
    bool have_prompt = false;
    std::vector<llama_token> tokens;
    bool have_tokens = false;
    int n_predict = 0, k = 10, n_ctx = 2048, n_threads = 2;
    bool all_logits = false, no_repack = false;

    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&]() -> const char * {
            if (i + 1 >= argc) { die("missing value for " + a); }
            return argv[++i];
        };
        if (a == "--prompt") {
            prompt = next();
            have_prompt = true;
        } else if (a == "--tokens") {
            std::string list = next();
            size_t p = 0;
            while (p <= list.size()) {
                size_t c = list.find(',', p);
                if (c == std::string::npos) { c = list.size(); }
                tokens.push_back(parse_int("--tokens", list.substr(p, c - p).c_str()));
                p = c + 1;
            }
            have_tokens = true;
        } else if (a == "--n-predict") {
            n_predict = parse_int("--n-predict", next());
        } else if (a == "--top-k") {
            k = parse_int("--top-k", next());
        } else if (a == "--ctx") {
            n_ctx = parse_int("--ctx", next());
        } else if (a == "--threads") {
            n_threads = parse_int("--threads", next());
        } else if (a == "--all-logits") {
            all_logits = true;
        } else if (a == "--no-repack") {
            no_repack = true;
        } else if (!model_path && a.rfind("--", 0) != 0) {
            model_path = argv[i];
        } else {
            die("unknown argument " + a);
        }
    }
    if (!model_path || have_prompt == have_tokens) {
        die("usage: refllama MODEL (--prompt TEXT | --tokens 1,2,3) [--n-predict N] [--top-k K] "
            "[--all-logits] [--ctx C] [--threads T] [--no-repack]");
    }
    if (n_threads < 1) { die("--threads must be >= 1"); }

    std::string sha;
    if (!sha256_file(model_path, sha)) { die(std::string("cannot read ") + model_path); }

    llama_log_set(log_cb, nullptr);
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    mp.use_extra_bufts = !no_repack;
    llama_model * model = llama_model_load_from_file(model_path, mp);
    if (!model) { die(std::string("cannot load ") + model_path); }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    if (have_prompt) {
        int n = -llama_tokenize(vocab, prompt.data(), int32_t(prompt.size()), nullptr, 0, true, true);
        if (n <= 0) { die("tokenization failed"); }
        tokens.resize(n);
        if (llama_tokenize(vocab, prompt.data(), int32_t(prompt.size()), tokens.data(), n, true, true) != n) {
            die("tokenization size changed between calls");
        }
    }
    for (llama_token t : tokens) {
        if (t < 0 || t >= n_vocab) { die("token id " + std::to_string(t) + " out of vocab range"); }
    }
    const int n_prompt = int(tokens.size());
    if (n_prompt == 0) { die("empty prompt"); }
    if (n_prompt + n_predict > n_ctx) { die("prompt + n-predict exceeds --ctx"); }

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = uint32_t(n_ctx);
    cp.n_batch = uint32_t(std::max(n_prompt, int(cp.n_batch)));
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { die("cannot create context"); }

    // One batch for the whole prompt; outputs only where the JSON needs them.
    llama_batch batch = llama_batch_init(n_prompt, 0, 1);
    for (int i = 0; i < n_prompt; ++i) {
        batch.token[i] = tokens[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = all_logits || i == n_prompt - 1;
    }
    batch.n_tokens = n_prompt;
    if (llama_decode(ctx, batch) != 0) { die("llama_decode failed on the prompt"); }

    std::string all_rows;
    if (all_logits) {
        all_rows = "[";
        for (int i = 0; i < n_prompt; ++i) {
            const float * row = llama_get_logits_ith(ctx, i);
            if (!row) { die("no logits for prompt position " + std::to_string(i)); }
            if (i) { all_rows += ",\n"; }
            all_rows += logits_row(row, n_vocab);
        }
        all_rows += "]";
    }

    std::string steps = "[";
    std::vector<llama_token> generated;
    llama_batch one = llama_batch_init(1, 0, 1);
    for (int s = 0; s < n_predict; ++s) {
        const float * row = llama_get_logits_ith(ctx, -1);
        if (!row) { die("no logits at step " + std::to_string(s)); }
        const int tok = argmax(row, n_vocab);
        const int pos = n_prompt - 1 + s;
        if (s) { steps += ",\n"; }
        steps += "{\"pos\":" + std::to_string(pos) + ",\"token\":" + std::to_string(tok) + ",\"top\":[";
        std::vector<int> top = top_k(row, n_vocab, k);
        for (size_t j = 0; j < top.size(); ++j) {
            if (j) { steps += ","; }
            steps += "[" + std::to_string(top[j]) + "," + json_f32(row[top[j]]) + "]";
        }
        steps += "]}";
        generated.push_back(tok);
        if (s + 1 == n_predict) { break; }
        one.token[0] = tok;
        one.pos[0] = pos + 1;
        one.n_seq_id[0] = 1;
        one.seq_id[0][0] = 0;
        one.logits[0] = 1;
        one.n_tokens = 1;
        if (llama_decode(ctx, one) != 0) { die("llama_decode failed at step " + std::to_string(s)); }
    }
    steps += "]";

    // Readable text for humans skimming the reference; special tokens shown.
    std::string completion;
    {
        std::vector<char> buf(1024);
        for (llama_token t : generated) {
            int n = llama_token_to_piece(vocab, t, buf.data(), int32_t(buf.size()), 0, true);
            if (n < 0) { buf.resize(size_t(-n)); n = llama_token_to_piece(vocab, t, buf.data(), int32_t(buf.size()), 0, true); }
            if (n > 0) { completion.append(buf.data(), size_t(n)); }
        }
    }

    std::string out = "{";
    out += "\"model_sha256\":" + json_str(sha);
    out += ",\n\"prompt\":" + (have_prompt ? json_str(prompt) : std::string("null"));
    out += ",\n\"prompt_tokens\":[";
    for (int i = 0; i < n_prompt; ++i) { out += (i ? "," : "") + std::to_string(tokens[i]); }
    out += "]";
    out += ",\n\"n_vocab\":" + std::to_string(n_vocab);
    out += ",\n\"settings\":{";
    out += "\"n_ctx\":" + std::to_string(llama_n_ctx(ctx));
    out += ",\"n_batch\":" + std::to_string(llama_n_batch(ctx));
    out += ",\"n_ubatch\":" + std::to_string(llama_n_ubatch(ctx));
    out += ",\"n_threads\":" + std::to_string(llama_n_threads(ctx));
    out += ",\"n_threads_batch\":" + std::to_string(llama_n_threads_batch(ctx));
    out += ",\"flash_attn_requested\":" + json_str(llama_flash_attn_type_name(cp.flash_attn_type));
    out += ",\"flash_attn_resolved\":" + json_str(flash_attn_resolved());
    out += ",\"type_k\":" + json_str(ggml_type_name(cp.type_k));
    out += ",\"type_v\":" + json_str(ggml_type_name(cp.type_v));
    out += ",\"swa_full\":" + std::string(cp.swa_full ? "true" : "false");
    out += ",\"use_extra_bufts\":" + std::string(mp.use_extra_bufts ? "true" : "false");
    out += ",\"system_info\":" + json_str(llama_print_system_info());
    out += ",\"log\":[";
    std::vector<std::string> lines = settings_log_lines();
    for (size_t i = 0; i < lines.size(); ++i) { out += (i ? "," : "") + json_str(lines[i]); }
    out += "],\"repacked\":[";
    std::vector<std::string> rep = repacked_tensors();
    for (size_t i = 0; i < rep.size(); ++i) { out += (i ? "," : "") + json_str(rep[i]); }
    out += "]}";
    out += ",\n\"completion\":" + json_str(completion);
    out += ",\n\"steps\":" + steps;
    if (all_logits) { out += ",\n\"all_logits\":" + all_rows; }
    out += "}\n";
    fwrite(out.data(), 1, out.size(), stdout);

    llama_batch_free(one);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
