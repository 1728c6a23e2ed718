#!/usr/bin/env python3
"""An agent's conversation memory in one echokv session.

    python3 client/python/examples/memory_chat.py --server localhost:50051 \
        --question "What did Lily find?" --question "What did she do then?"

Seeds the memory with a short exchange, asks the questions (answers streamed and
committed to the session), forks the conversation to ask one question on a branch
without touching the main line, and reports how much KV memory the compressed session
holds. With --save FILE it exports the session and restores it from the file (servers
that do not implement ExportSession yet say so). Needs a model with a chat template
(ServerInfo.model.chat_template).
"""

import argparse
import sys

import echokv


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="localhost:50051")
    parser.add_argument("--budget", type=int, default=256, help="KV entries per layer/group")
    parser.add_argument("--memory", default="tiered", choices=["tiered", "evict"])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--question", action="append",
                        help="a question to ask (repeatable)")
    parser.add_argument("--save", help="export the session to this file and restore it")
    args = parser.parse_args()
    questions = args.question or ["What did Lily find?", "What did she do then?"]

    with echokv.Client(args.server) as client:
        memory = echokv.Memory(client, compression={"policy": "echokv", "budget": args.budget},
                               memory=args.memory, generate={"max_tokens": args.max_tokens})
        try:
            memory.add([
                {"role": "system", "content": "You tell short stories for children."},
                {"role": "user", "content": "Tell me about Lily."},
                {"role": "assistant", "content": "Lily was a little girl who loved to "
                                                 "play in the park with her friends."},
            ])
        except echokv.Unimplemented as e:
            sys.exit("the server's model has no chat template: %s" % e.message)

        for question in questions:
            print("user:", question)
            print("assistant: ", end="", flush=True)
            answer = memory.ask(question)  # streamed; the answer joins the session
            for piece in answer:
                print(piece, end="", flush=True)
            print("  [%s, %d tokens]" % (answer.result.finish_reason,
                                         answer.result.generated_tokens))

        branch = memory.fork()  # a what-if branch: the main line is unchanged
        print("branch: ", branch.ask("What if it rained?", stream=False))

        session = memory.session()
        print("session %s: %d tokens seen, %d of %d KV bytes held (%.0f%% saved)" % (
            session.id, session.tokens_seen, session.retained_kv_bytes, session.full_kv_bytes,
            100.0 * session.bytes_saved / max(1, session.full_kv_bytes)))

        if args.save:
            try:
                size = memory.export(args.save)
                restored = echokv.Memory.import_(client, args.save)
                print("saved %d bytes to %s; restored as session %s"
                      % (size, args.save, restored.session_id))
                restored.delete()
            except echokv.Unimplemented as e:
                print("export/import not available on this server (%s)" % e)
        branch.delete()
        memory.delete()


if __name__ == "__main__":
    main()
