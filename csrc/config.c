/* config.c: the table of NEEDLE_* variables (config.h) as data, and the
 * engine's two parsers of them, counts and choices. Each variable's
 * meaning is its reader's; this file only knows names, text and ranges.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static const nd_config_row rows[ND_CFG_VAR_COUNT] = {
#define ND_CONFIG_ROW(id, section, kind, lo, hi, choices, deflt, accepts, doc) \
    {"NEEDLE_" #id, section, kind, lo, hi, choices, deflt, accepts, doc},
    ND_CONFIG_VARS(ND_CONFIG_ROW)
#undef ND_CONFIG_ROW
};

const nd_config_row *nd_config_row_of(nd_config_var v) { return &rows[v]; }

const char *nd_config_kind_name(nd_config_kind kind) {
    switch (kind) {
    case ND_CFG_COUNT: return "count";
    case ND_CFG_CHOICE: return "choice";
    case ND_CFG_SWITCH: return "switch";
    case ND_CFG_NUMBER: return "number";
    case ND_CFG_SIZE: return "size";
    case ND_CFG_LIBRARY: return "library";
    case ND_CFG_CAPABILITY: return "capability";
    case ND_CFG_LIST: return "list";
    case ND_CFG_PATH: return "path";
    }
    return "?";
}

const char *nd_config_section_name(nd_config_section section) {
    switch (section) {
    case ND_CFG_RUN: return "run";
    case ND_CFG_BUILD: return "build";
    case ND_CFG_TEST: return "test";
    }
    return "?";
}

int nd_config_text(nd_config_var v, char *buf, size_t size) {
    buf[0] = '\0';
    const char *value = getenv(rows[v].name);
    if (value == NULL) return 0;
    while (isspace((unsigned char)*value)) value++;
    size_t n = strlen(value);
    while (n > 0 && isspace((unsigned char)value[n - 1])) n--;
    if (n == 0) return 0;
    if (n >= size) {
        nd_fail(ND_ERR_VALUE, "%s='%.40s...': expected %s (the value is too long)", rows[v].name,
                value, rows[v].accepts);
        return -1;
    }
    memcpy(buf, value, n);
    buf[n] = '\0';
    return 1;
}

/* Longer than any count or choice: a longer value is refused by length. */
#define SHORT_VALUE 64

static int refuse(nd_config_var v, const char *text) {
    nd_fail(ND_ERR_VALUE, "%s='%.40s': expected %s", rows[v].name, text, rows[v].accepts);
    return -1;
}

int nd_config_count(nd_config_var v, int64_t *out) {
    char text[SHORT_VALUE];
    int set = nd_config_text(v, text, sizeof text);
    if (set <= 0) return set;
    /* Digits only: strtoll alone would take "+3", " 3" and "0x10". */
    for (const char *c = text; *c; c++)
        if (!isdigit((unsigned char)*c) && !(c == text && *c == '-')) return refuse(v, text);
    char *end = NULL;
    errno = 0;
    long long n = strtoll(text, &end, 10);
    if (end == text || *end != '\0' || errno != 0 || n < rows[v].lo || n > rows[v].hi)
        return refuse(v, text);
    *out = (int64_t)n;
    return 1;
}

int nd_config_choice(nd_config_var v, int *index) {
    char text[SHORT_VALUE];
    int set = nd_config_text(v, text, sizeof text);
    if (set <= 0) return set;
    size_t len = strlen(text);
    const char *word = rows[v].choices;
    for (int i = 0; *word != '\0'; i++) {
        size_t word_len = strcspn(word, "|");
        if (word_len == len && strncmp(word, text, len) == 0) {
            *index = i;
            return 1;
        }
        word += word_len;
        if (*word == '|') word++;
    }
    return refuse(v, text);
}
