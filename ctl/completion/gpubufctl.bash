# bash completion for gpubufctl(1).
# Commands, options, --state values; pool names for --pool and buffer names
# for delete come from the running daemon (quietly nothing when none runs).

_gpubufctl_query() {
    # $1: what to list (pools or buffers); the socket given on the line, if any.
    local sock=() i
    for ((i = 1; i < ${#COMP_WORDS[@]} - 1; i++)); do
        case ${COMP_WORDS[i]} in
        -s | --socket) sock=(--socket "${COMP_WORDS[i + 1]}") ;;
        --socket=*) sock=(--socket "${COMP_WORDS[i]#--socket=}") ;;
        esac
    done
    # Rows of the pools table have a kind in their second column (the lines
    # below it name the default pool and the publish rules).
    local pools
    pools=$(gpubufctl "${sock[@]}" pools 2>/dev/null)
    if [[ $1 == pools ]]; then
        awk 'NR > 1 && $2 ~ /^(host|cuda-ipc|cuda-vmm)$/ { print $1 }' <<<"$pools"
    else
        # Names are per pool: /POOL/NAME for every buffer, and NAME alone
        # for those of the default pool (where a plain name is looked up).
        local def
        def=$(sed -n "s/^names without a pool .* in pool '\(.*\)'\$/\1/p" <<<"$pools")
        gpubufctl "${sock[@]}" buffers 2>/dev/null |
            awk -v def="$def" 'NR > 1 && $2 != "(anonymous)" { print "/" $3 "/" $2; if ($3 == def) print $2 }'
    fi
}

_gpubufctl() {
    local cur prev words cword
    if declare -F _init_completion >/dev/null; then
        _init_completion -n = || return
    else
        cur=${COMP_WORDS[COMP_CWORD]}
        prev=${COMP_WORDS[COMP_CWORD - 1]}
        words=("${COMP_WORDS[@]}")
        cword=$COMP_CWORD
    fi
    local commands="status pools buffers clients metrics delete"
    local options="--socket --json --pretty --watch --output --pool --name --state --pid --uid --id --help"
    case $prev in
    -s | --socket | -o | --output)
        COMPREPLY=($(compgen -f -- "$cur"))
        return
        ;;
    --state)
        COMPREPLY=($(compgen -W "allocated sealed deleted" -- "$cur"))
        return
        ;;
    --pool)
        COMPREPLY=($(compgen -W "$(_gpubufctl_query pools)" -- "$cur"))
        return
        ;;
    --name | --pid | --uid)
        return
        ;;
    esac
    case $cur in
    --watch=*)
        return
        ;;
    -*)
        COMPREPLY=($(compgen -W "$options" -- "$cur"))
        return
        ;;
    esac
    # The command is the first word that is not an option or an option's value.
    local i cmd=
    for ((i = 1; i < cword; i++)); do
        case ${words[i]} in
        -s | --socket | -o | --output | --pool | --name | --state | --pid | --uid) ((i++)) ;;
        -*) ;;
        *) cmd=${words[i]}; break ;;
        esac
    done
    if [[ -z $cmd ]]; then
        COMPREPLY=($(compgen -W "$commands" -- "$cur"))
    elif [[ $cmd == delete ]]; then
        COMPREPLY=($(compgen -W "$(_gpubufctl_query buffers)" -- "$cur"))
    fi
}
complete -F _gpubufctl gpubufctl
