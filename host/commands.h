/*
 * commands.h — the `berth` subcommands main.c dispatches to.
 *
 * Each gets the arguments from the subcommand's own name on (argv[0] = "plugins", "generate", ...) and returns
 * the process exit status: 0 success, 1 a fatal error (already printed as one line on stderr), 2 bad usage.
 */
#ifndef BERTH_HOST_COMMANDS_H
#define BERTH_HOST_COMMANDS_H

/* `berth plugins --config F [--model DIR]` (cmd_plugins.c). */
int cmd_plugins(int argc, char **argv);
/* `berth generate ...` (cmd_generate.c). */
int cmd_generate(int argc, char **argv);

#endif
