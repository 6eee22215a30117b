#!/usr/bin/env bash
# Turn the wire test vectors (crates/wire/fixtures/*.hex) into binary seed inputs under
# fuzz/corpus/<target>/. The corpus is generated and git-ignored.
#
#   frame      every fixture, as a whole message
#   control    every fixture as a whole message, plus the body of each control* fixture
#   handshake  every fixture as a whole message, plus the body of each hello* fixture, plus
#              one of each sealed UDP datagram (crates/link/fixtures/sealed_*.hex)
#   records    a few device records (input, display, cursor) and an RFC 2217 opening
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
fixtures="$here/../crates/wire/fixtures"
corpus="$here/corpus"

# Hex text (whitespace ignored, '#' comments) to bytes. perl is part of every Debian base.
hex2bin() {
    perl -0777 -ne 's/#[^\n]*//g; s/\s+//g; print pack("H*", $_)' "$1"
}

mkdir -p "$corpus/frame" "$corpus/control" "$corpus/handshake" "$corpus/records" "$corpus/session" "$corpus/image"
count=0
for f in "$fixtures"/*.hex; do
    name="$(basename "$f" .hex)"
    for t in frame control handshake; do
        hex2bin "$f" >"$corpus/$t/$name"
    done
    # The session target reads an opcode byte (0x00: a message follows) before each message.
    { printf '\x00'; hex2bin "$f"; } >"$corpus/session/$name"
    case "$name" in
    control*) hex2bin "$f" | tail -c +11 >"$corpus/control/$name.body" ;;
    hello* | bad_hello*) hex2bin "$f" | tail -c +11 >"$corpus/handshake/$name.body" ;;
    esac
    count=$((count + 1))
done
for f in "$here"/../crates/link/fixtures/sealed_*.hex; do
    hex2bin "$f" >"$corpus/handshake/$(basename "$f" .hex)"
done
# Device records (docs/endpoints.md): an input release-all, an input batch with one key
# press, and a 1x1 display keyframe update.
printf '\x01\x02' >"$corpus/records/input_release_all"
printf '\x01\x00\x00\x01\x00\x01\x00\x1e\x00\x00\x00\x01\x00\x00\x00\x00' >"$corpus/records/input_key"
printf '\x01\x00\x00\x01\x00\x01\x00\x01\x00\x01\x00\x00\x00\x00\x00\x01\x00\x01\x00\x10\x20\x30\x00' >"$corpus/records/display_1x1"
# A 1x1 cursor record (hot spot 0,0; one opaque pixel).
printf '\x01\x01\x00\x01\x00\x01\x00\x00\x00\x00\x10\x20\x30\xff' >"$corpus/records/cursor_1x1"
# RFC 2217: pyserial's opening (WILL/DO BINARY, SGA, COM-PORT) then SET-BAUDRATE 9600 and
# data with a doubled IAC.
printf '\xff\xfb\x00\xff\xfd\x00\xff\xfb\x03\xff\xfd\x03\xff\xfb\x2c\xff\xfa\x2c\x01\x00\x00\x25\x80\xff\xf0hi\xff\xff' >"$corpus/records/rfc2217_open"
# Audio: 48 kHz mono PCM, two samples (docs/endpoints.md, "Audio records").
printf '\x01\x00\x00\x00\xbb\x80\x01\x00\x02\x01\x00\xfe\xff' >"$corpus/records/audio_pcm"
# The image pair: one frame of a 1x1 screen with a solid rect (docs/modules.md, "image"), and
# the 1x1 display update (which the target also runs through the forward half).
printf '\x02\x00\x01\x00\x01\x01\x00\x01\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x01\x01\x10\x20\x30' >"$corpus/image/solid_1x1"
cp "$corpus/records/display_1x1" "$corpus/image/display_1x1"
echo "seed-corpus: $count fixtures -> $corpus/{frame,control,handshake,session}, 4 sealed UDP datagrams -> $corpus/handshake, 6 device records -> $corpus/records, 2 -> $corpus/image"
