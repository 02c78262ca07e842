// opdump: every intermediate tensor of one llama.cpp forward pass, written
// whole to files, so an engine's per-op values can be compared with
// llama.cpp's element by element (llama-eval-callback prints three values and
// a sum per tensor, too few to measure a relative error).
//
// The pass is an embedding pass as llama-embedding runs it (`embeddings` on,
// the pooling given, 2 threads by default, one batch), over token ids given
// on the command line. Each tensor the graph computes is written as
// OUT/<name>.f32 (little-endian f32, its elements in ggml order, the first
// dimension fastest; f16 tensors widened); names repeat per layer as
// `<op>-<layer>` (ggml's callback names), and OUT/index.tsv lists
// `name<TAB>op<TAB>type<TAB>ne0,ne1,ne2,ne3` in evaluation order.
//
// usage: opdump MODEL OUT --tokens 2,818 [--pooling mean|none|cls|last]
//               [--threads T] [--no-repack]
// Build: tools/refllama/opdiff.py does (one g++ line, as gen.py builds refllama).

#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace {

struct Dump {
    std::string dir;
    std::ofstream index;
    std::map<std::string, int> seen;
    std::vector<uint8_t> buf;
};

[[noreturn]] void die(const std::string & msg) {
    std::fprintf(stderr, "opdump: %s\n", msg.c_str());
    std::exit(1);
}

bool on_tensor(ggml_tensor * t, bool ask, void * user) {
    if (ask) { return true; }
    auto * d = static_cast<Dump *>(user);
    if (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16) { return true; }
    const size_t n_bytes = ggml_nbytes(t);
    d->buf.resize(n_bytes);
    ggml_backend_tensor_get(t, d->buf.data(), 0, n_bytes);
    const int64_t n = ggml_nelements(t);
    std::vector<float> out(static_cast<size_t>(n));
    // Element (i0, i1, i2, i3) of a possibly strided view, first dimension fastest.
    size_t k = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; ++i3) {
        for (int64_t i2 = 0; i2 < t->ne[2]; ++i2) {
            for (int64_t i1 = 0; i1 < t->ne[1]; ++i1) {
                for (int64_t i0 = 0; i0 < t->ne[0]; ++i0) {
                    const size_t at = i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
                    if (t->type == GGML_TYPE_F32) {
                        std::memcpy(&out[k], &d->buf[at], 4);
                    } else {
                        ggml_fp16_t h;
                        std::memcpy(&h, &d->buf[at], 2);
                        out[k] = ggml_fp16_to_fp32(h);
                    }
                    ++k;
                }
            }
        }
    }
    std::string name = t->name;
    for (char & c : name) {
        if (c == '/' || c == ' ' || c == '(' || c == ')') { c = '_'; }
    }
    // A name computed twice (views, copies) keeps its first value; later ones get a suffix.
    const int count = d->seen[name]++;
    if (count > 0) { name += "#" + std::to_string(count); }
    std::ofstream f(d->dir + "/" + name + ".f32", std::ios::binary);
    f.write(reinterpret_cast<const char *>(out.data()), std::streamsize(out.size() * 4));
    d->index << name << '\t' << ggml_op_desc(t) << '\t' << ggml_type_name(t->type) << '\t' << t->ne[0] << ','
             << t->ne[1] << ',' << t->ne[2] << ',' << t->ne[3] << '\n';
    return true;
}

enum llama_pooling_type pooling_of(const std::string & s) {
    if (s == "none") { return LLAMA_POOLING_TYPE_NONE; }
    if (s == "mean") { return LLAMA_POOLING_TYPE_MEAN; }
    if (s == "cls") { return LLAMA_POOLING_TYPE_CLS; }
    if (s == "last") { return LLAMA_POOLING_TYPE_LAST; }
    die("unknown pooling " + s);
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc < 3) { die("usage: opdump MODEL OUT --tokens 2,818 [--pooling P] [--threads T] [--no-repack]"); }
    const char * model_path = argv[1];
    Dump d;
    d.dir = argv[2];
    std::vector<llama_token> tokens;
    std::string pooling = "mean";
    int threads = 2;
    bool no_repack = false;
    for (int i = 3; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) { die(a + " needs a value"); }
            return argv[++i];
        };
        if (a == "--tokens") {
            const std::string v = next();
            size_t at = 0;
            while (at <= v.size()) {
                const size_t comma = v.find(',', at);
                tokens.push_back(llama_token(std::stol(v.substr(at, comma - at))));
                if (comma == std::string::npos) { break; }
                at = comma + 1;
            }
        } else if (a == "--pooling") {
            pooling = next();
        } else if (a == "--threads") {
            threads = std::stoi(next());
        } else if (a == "--no-repack") {
            no_repack = true;
        } else {
            die("unknown argument " + a);
        }
    }
    if (tokens.empty()) { die("--tokens is required"); }
    d.index.open(d.dir + "/index.tsv");
    if (!d.index) { die("cannot write " + d.dir + "/index.tsv"); }

    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.use_extra_bufts = !no_repack;
    llama_model * model = llama_model_load_from_file(model_path, mp);
    if (!model) { die(std::string("cannot load ") + model_path); }

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 2048;
    cp.n_batch = 2048;
    cp.n_ubatch = 2048;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.embeddings = true;
    cp.pooling_type = pooling_of(pooling);
    cp.cb_eval = on_tensor;
    cp.cb_eval_user_data = &d;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { die("cannot create context"); }

    llama_batch batch = llama_batch_init(int32_t(tokens.size()), 0, 1);
    for (size_t i = 0; i < tokens.size(); ++i) {
        batch.token[i] = tokens[i];
        batch.pos[i] = llama_pos(i);
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = true;
    }
    batch.n_tokens = int32_t(tokens.size());
    if (llama_decode(ctx, batch) != 0) { die("llama_decode failed"); }
    std::fprintf(stderr, "opdump: %zu tensors written to %s\n", d.seen.size(), d.dir.c_str());
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
