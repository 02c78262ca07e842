// Prints llama.cpp's pre-tokenizer words for a text: `unicode_regex_split`
// (llama.cpp's src/unicode.cpp) run with one regex, the words as hex, one
// per line. Built and driven by gen_split.py; see there.
//
// usage: split_words REGEX_FILE TEXT_FILE
#include "unicode.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static std::string slurp(const char * path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

int main(int argc, char ** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s REGEX_FILE TEXT_FILE\n", argv[0]);
        return 2;
    }
    const std::vector<std::string> exprs = { slurp(argv[1]) };
    for (const auto & w : unicode_regex_split(slurp(argv[2]), exprs, false)) {
        for (unsigned char c : w) {
            printf("%02x", c);
        }
        printf("\n");
    }
    return 0;
}
