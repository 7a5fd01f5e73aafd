/*
 * main.c — the `berth` command line: global options, then one subcommand (see commands.h).
 */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "host_services.h"

#ifndef BERTH_VERSION
#define BERTH_VERSION "0.0.0"
#endif

static const char usage_text[] =
    "usage: berth [-v | -vv] COMMAND [OPTIONS]\n"
    "       berth --help | --version\n"
    "\n"
    "Commands:\n"
    "  plugins --config FILE [--model DIR]\n"
    "                  list every plugin the config names (loaded or rejected, and why), the devices each\n"
    "                  backend found and what it can do; with --model, which model plugin and backend would\n"
    "                  run the checkpoint in DIR and why the others were not chosen\n"
    "  generate ...    run a model (berth generate --help)\n"
    "  chat ...        talk to a model, one line a turn, replies streamed (berth chat --help)\n"
    "  bench ...       serving throughput and latency per concurrency level (berth bench --help)\n"
    "  tokenize --model DIR [--json] TEXT\n"
    "                  the token ids and pieces of TEXT under the checkpoint's tokenizer.json\n"
    "\n"
    "Options:\n"
    "  -v, -vv         log more on stderr (info, then debug); the default shows warnings and errors\n"
    "  -h, --help      this text\n"
    "  --version       print the version and the plugin ABI\n"
    "\n"
    "Environment:\n"
    "  BERTH_BACKEND=NAME   run on backend NAME whatever the config's priorities (fatal if NAME is not loaded)\n";

int main(int argc, char **argv)
{
    int level = BERTH_LOG_WARN;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(usage_text, stdout);
            return 0;
        }
        if (strcmp(a, "--version") == 0) {
            printf("berth %s (plugin ABI %d.%d)\n", BERTH_VERSION, BERTH_ABI_MAJOR, BERTH_ABI_MINOR);
            return 0;
        }
        if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) {
            level++;
        } else if (strcmp(a, "-vv") == 0) {
            level += 2;
        } else {
            fprintf(stderr, "berth: unknown option '%s'\n\n%s", a, usage_text);
            return 2;
        }
    }
    host_log_set_level(level);
    if (i >= argc) {
        fprintf(stderr, "berth: no command given\n\n%s", usage_text);
        return 2;
    }
    const char *cmd = argv[i];
    if (strcmp(cmd, "plugins") == 0)
        return cmd_plugins(argc - i, argv + i);
    if (strcmp(cmd, "generate") == 0)
        return cmd_generate(argc - i, argv + i);
    if (strcmp(cmd, "chat") == 0)
        return cmd_chat(argc - i, argv + i);
    if (strcmp(cmd, "tokenize") == 0)
        return cmd_tokenize(argc - i, argv + i);
    if (strcmp(cmd, "bench") == 0)
        return cmd_bench(argc - i, argv + i);
    if (strcmp(cmd, "help") == 0) {
        fputs(usage_text, stdout);
        return 0;
    }
    fprintf(stderr, "berth: unknown command '%s'\n\n%s", cmd, usage_text);
    return 2;
}
