package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
)

// commandNames are the words completion offers after proxyfleet, as
// "dead ls" for a sub-verb.
func commandNames() []string {
	names := []string{"serve", "setup", "worker", "health", "gateway", "pools", "console"}
	for _, v := range verbs {
		names = append(names, v.name)
	}
	return append(names, "version", "completion", "help")
}

// fileFlags take a path; completion offers files after them.
var fileFlags = []string{"--config", "--creds", "--nkey", "--tlscert", "--tlskey", "--tlsca", "--data-dir"}

// flagsOf reads a command's flags from its --help, so completion always
// knows the flags the command has.
func flagsOf(name string) []string {
	var out bytes.Buffer
	words := strings.Fields(name)
	if err := run(context.Background(), words[0], append(words[1:], "--help"), &out, io.Discard); err != nil {
		return nil
	}
	var flags []string
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		line := sc.Text()
		if f, ok := strings.CutPrefix(line, "  -"); ok {
			flags = append(flags, "-"+strings.Fields(f)[0])
		}
	}
	return flags
}

// completion is `proxyfleet completion bash|zsh`.
func completion(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("completion", stderr)
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() != 1 || !slices.Contains([]string{"bash", "zsh"}, fs.Arg(0)) {
		return usageError(fs)
	}
	var tops []string
	for _, n := range commandNames() {
		if w := strings.Fields(n)[0]; !slices.Contains(tops, w) {
			tops = append(tops, w)
		}
	}
	var cases strings.Builder
	for _, n := range commandNames() {
		if n == "help" {
			continue
		}
		fmt.Fprintf(&cases, "    %s) flags=%q ;;\n", strings.ReplaceAll(n, " ", "_"), strings.Join(flagsOf(n), " "))
	}
	script := bashCompletion
	if fs.Arg(0) == "zsh" {
		script = zshCompletion
	}
	r := strings.NewReplacer("@COMMANDS@", strings.Join(tops, " "), "@CASES@", cases.String(),
		"@FILEFLAGS@", strings.Join(fileFlags, "|"))
	_, err := io.WriteString(stdout, r.Replace(script))
	return err
}

const bashCompletion = `# bash completion for proxyfleet: source <(proxyfleet completion bash)
_proxyfleet() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} cmd=${COMP_WORDS[1]} flags=
  if [[ $COMP_CWORD -eq 1 ]]; then
    COMPREPLY=($(compgen -W "@COMMANDS@" -- "$cur"))
    return
  fi
  case $cmd in
    dead)
      if [[ $COMP_CWORD -eq 2 ]]; then
        COMPREPLY=($(compgen -W "ls replay" -- "$cur"))
        return
      fi
      cmd=dead_${COMP_WORDS[2]} ;;
    pool)
      if [[ $COMP_CWORD -eq 2 ]]; then
        COMPREPLY=($(compgen -W "set get ls rm recycle" -- "$cur"))
        return
      fi
      cmd=pool_${COMP_WORDS[2]} ;;
    host)
      if [[ $COMP_CWORD -eq 2 ]]; then
        COMPREPLY=($(compgen -W "quarantine release" -- "$cur"))
        return
      fi
      cmd=host_${COMP_WORDS[2]} ;;
    completion) COMPREPLY=($(compgen -W "bash zsh" -- "$cur")); return ;;
    help) COMPREPLY=($(compgen -W "@COMMANDS@" -- "$cur")); return ;;
  esac
  case $prev in
    @FILEFLAGS@) COMPREPLY=($(compgen -f -- "$cur")); return ;;
    --context)
      local dir=${XDG_CONFIG_HOME:-$HOME/.config}/nats/context f names=
      for f in "$dir"/*.json; do [[ -e $f ]] && names+=" $(basename "$f" .json)"; done
      COMPREPLY=($(compgen -W "$names" -- "$cur"))
      return ;;
  esac
  case $cmd in
@CASES@  esac
  COMPREPLY=($(compgen -W "$flags" -- "$cur"))
}
complete -F _proxyfleet proxyfleet
`

const zshCompletion = `#compdef proxyfleet
# zsh completion for proxyfleet: proxyfleet completion zsh > "${fpath[1]}/_proxyfleet"
_proxyfleet() {
  local cmd=${words[2]} flags=
  if (( CURRENT == 2 )); then
    compadd -- @COMMANDS@
    return
  fi
  case $cmd in
    dead)
      if (( CURRENT == 3 )); then
        compadd -- ls replay
        return
      fi
      cmd=dead_${words[3]} ;;
    pool)
      if (( CURRENT == 3 )); then
        compadd -- set get ls rm recycle
        return
      fi
      cmd=pool_${words[3]} ;;
    host)
      if (( CURRENT == 3 )); then
        compadd -- quarantine release
        return
      fi
      cmd=host_${words[3]} ;;
    completion) compadd -- bash zsh; return ;;
    help) compadd -- @COMMANDS@; return ;;
  esac
  case ${words[CURRENT-1]} in
    @FILEFLAGS@) _files; return ;;
    --context)
      local dir=${XDG_CONFIG_HOME:-$HOME/.config}/nats/context
      compadd -- ${dir}/*.json(N:t:r)
      return ;;
  esac
  case $cmd in
@CASES@  esac
  compadd -- ${=flags}
}
if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
  _proxyfleet "$@"
else
  compdef _proxyfleet proxyfleet
fi
`
