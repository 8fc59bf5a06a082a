/**
 * An argv as one POSIX shell line that runs exactly it: what a template's start command is (the
 * engine and E2B run it with `/bin/sh -c`), for a Dockerfile's exec-form CMD or an image's
 * Entrypoint + Cmd.
 */
export function shellJoin(argv: readonly string[]): string {
  return argv.map((arg) => (/^[A-Za-z0-9_@%+=:,./-]+$/.test(arg) ? arg : `'${arg.replace(/'/g, `'\\''`)}'`)).join(' ');
}
