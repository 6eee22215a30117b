//! Telnet with the RFC 2217 COM-port option, sans-IO: bytes from the peer in, serial
//! messages and replies out. Both roles: a **server** (what `rfc2217-server` is to pyserial's
//! `rfc2217://` or any RFC 2217 client) and a **client** (what `rfc2217-client` is to ser2net
//! or pyserial's `PortManager`).
//!
//! What is spoken (RFC 854/855, RFC 856 binary, RFC 858 suppress-go-ahead, RFC 2217):
//! - Option negotiation: BINARY, SGA and COM-PORT-OPTION (44) are accepted in both
//!   directions, every other option is refused (`WONT`/`DONT`), ECHO included. Each side
//!   asks for the three at the start; an answer to our own request is not answered again,
//!   so negotiation cannot loop.
//! - Data: `IAC IAC` is a 255 data byte both ways; the stream is binary (no CR NUL rule:
//!   pyserial and ser2net negotiate BINARY).
//! - COM-PORT commands, client → server code 1..=12, server → client the same + 100:
//!   SET-BAUDRATE (u32 BE), SET-DATASIZE, SET-PARITY (1 none, 2 odd, 3 even, 4 mark, 5 space),
//!   SET-STOPSIZE (1, 2; 3 = 1.5 is refused), SET-CONTROL (flow 1/2/3, break 5/6, DTR 8/9,
//!   RTS 11/12, and their queries 0/4/7/10), NOTIFY-LINESTATE, NOTIFY-MODEMSTATE (CD 0x80,
//!   RI 0x40, DSR 0x20, CTS 0x10, deltas in the low nibble), FLOWCONTROL-SUSPEND/RESUME,
//!   SET-LINESTATE-MASK, SET-MODEMSTATE-MASK, PURGE-DATA. A value 0 asks for the current
//!   setting.
//!
//! The server answers every SET with the value now in force (the requested one, or its own
//! when the request is out of range), as pyserial's client waits for. It sends the modem
//! state once the client agrees on RFC 2217, on every change, and when polled.
//!
//! Nothing a peer sends makes this panic: a subnegotiation longer than
//! [`MAX_SUBNEGOTIATION`] or with a bad length or value is reported as [`Note::Bad`] and
//! dropped; the connection goes on.

use super::super::record::{Flow, LineSettings, ModemLines, Parity};

/// Interpret As Command.
pub const IAC: u8 = 255;
/// Option refused (peer side).
pub const DONT: u8 = 254;
/// Option requested (peer side).
pub const DO: u8 = 253;
/// Option refused (our side).
pub const WONT: u8 = 252;
/// Option offered (our side).
pub const WILL: u8 = 251;
/// Subnegotiation begin.
pub const SB: u8 = 250;
/// Subnegotiation end.
pub const SE: u8 = 240;
/// Option: 8-bit data path.
pub const BINARY: u8 = 0;
/// Option: echo.
pub const ECHO: u8 = 1;
/// Option: suppress go-ahead.
pub const SGA: u8 = 3;
/// Option: RFC 2217 COM port control.
pub const COM_PORT: u8 = 44;
/// Longest subnegotiation accepted (the longest RFC 2217 one, SET-BAUDRATE, is 6 bytes).
pub const MAX_SUBNEGOTIATION: usize = 64;
/// What a server adds to a command code in its answers.
pub const SERVER_OFFSET: u8 = 100;

/// Command codes (client → server).
pub mod cmd {
    /// SET-BAUDRATE.
    pub const SET_BAUDRATE: u8 = 1;
    /// SET-DATASIZE.
    pub const SET_DATASIZE: u8 = 2;
    /// SET-PARITY.
    pub const SET_PARITY: u8 = 3;
    /// SET-STOPSIZE.
    pub const SET_STOPSIZE: u8 = 4;
    /// SET-CONTROL.
    pub const SET_CONTROL: u8 = 5;
    /// NOTIFY-LINESTATE.
    pub const NOTIFY_LINESTATE: u8 = 6;
    /// NOTIFY-MODEMSTATE.
    pub const NOTIFY_MODEMSTATE: u8 = 7;
    /// FLOWCONTROL-SUSPEND.
    pub const FLOW_SUSPEND: u8 = 8;
    /// FLOWCONTROL-RESUME.
    pub const FLOW_RESUME: u8 = 9;
    /// SET-LINESTATE-MASK.
    pub const SET_LINESTATE_MASK: u8 = 10;
    /// SET-MODEMSTATE-MASK.
    pub const SET_MODEMSTATE_MASK: u8 = 11;
    /// PURGE-DATA.
    pub const PURGE_DATA: u8 = 12;
}

/// SET-CONTROL values.
pub mod control {
    /// Ask for the flow control setting.
    pub const REQ_FLOW: u8 = 0;
    /// No flow control.
    pub const FLOW_NONE: u8 = 1;
    /// XON/XOFF.
    pub const FLOW_XONXOFF: u8 = 2;
    /// RTS/CTS.
    pub const FLOW_RTSCTS: u8 = 3;
    /// Ask for the break state.
    pub const REQ_BREAK: u8 = 4;
    /// Break on.
    pub const BREAK_ON: u8 = 5;
    /// Break off.
    pub const BREAK_OFF: u8 = 6;
    /// Ask for DTR.
    pub const REQ_DTR: u8 = 7;
    /// DTR on.
    pub const DTR_ON: u8 = 8;
    /// DTR off.
    pub const DTR_OFF: u8 = 9;
    /// Ask for RTS.
    pub const REQ_RTS: u8 = 10;
    /// RTS on.
    pub const RTS_ON: u8 = 11;
    /// RTS off.
    pub const RTS_OFF: u8 = 12;
}

/// NOTIFY-MODEMSTATE bits.
pub mod modem {
    /// Carrier detect.
    pub const CD: u8 = 0x80;
    /// Ring indicator.
    pub const RI: u8 = 0x40;
    /// Data set ready.
    pub const DSR: u8 = 0x20;
    /// Clear to send.
    pub const CTS: u8 = 0x10;
}

/// Which end of the telnet connection this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The access server: owns the port, answers the client's commands.
    Server,
    /// The client: asks the server to set the port.
    Client,
}

/// Something the peer said that the owner of the codec acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// Bytes of data, unescaped (consecutive data bytes come as one note).
    Data(Vec<u8>),
    /// Server role: the client changed the line settings (consecutive SET commands come as
    /// one note, in order with the data around them).
    Settings(LineSettings),
    /// Server role: the client set DTR and/or RTS (`valid` says which).
    /// Client role: the server reported CTS/DSR/DCD/RI.
    Modem(ModemLines),
    /// Server role: the client asked for a break (`true`) or its end.
    Break(bool),
    /// Server role: the client asked to purge the port's buffers (PURGE-DATA: 1 what the
    /// port received, 2 what waits to be sent, 3 both).
    Purge(u8),
    /// Client role: the server answered a SET with another value than asked (what, asked,
    /// got).
    Refused(&'static str, u32, u32),
    /// Both: the peer agreed on RFC 2217.
    ComPortAgreed,
    /// Both: a subnegotiation or command this codec could not use, dropped.
    Bad(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Data,
    Iac,
    Negotiate(u8),
    Sub,
    SubIac,
}

/// Per-option negotiation state: enabled on our side / the peer's, and whether we asked.
#[derive(Debug, Clone, Copy, Default)]
struct Opt {
    us: bool,
    them: bool,
    asked_will: bool,
    asked_do: bool,
}

fn supported(option: u8) -> bool {
    matches!(option, BINARY | SGA | COM_PORT)
}

/// The codec. Feed it what the peer sent, take what to send back from [`Telnet::take_out`].
#[derive(Debug)]
pub struct Telnet {
    role: Role,
    state: State,
    sub: Vec<u8>,
    sub_overflow: bool,
    opts: [Opt; 3],
    out: Vec<u8>,
    /// Server: the settings the client sees. Client: the settings asked for.
    settings: LineSettings,
    /// Server: DTR/RTS as the client set them. Client: as asked.
    outputs: ModemLines,
    /// Server: CTS/DSR/DCD/RI of the port as last reported (RFC 2217 bits).
    modem_state: u8,
    modem_mask: u8,
    agreed: bool,
    breaking: bool,
    /// Client: the values asked by SET-BAUDRATE, -DATASIZE, -PARITY and -STOPSIZE that the
    /// server has not answered yet, oldest first (it answers each SET in turn, so an answer
    /// is to the oldest; settings changed quickly have several on the way).
    pending: [std::collections::VecDeque<u32>; 4],
}

/// SET commands a client keeps track of, at most this many unanswered per parameter (a
/// server that never answers does not make the queue grow).
const PENDING_MAX: usize = 16;

fn opt_index(option: u8) -> usize {
    match option {
        BINARY => 0,
        SGA => 1,
        _ => 2,
    }
}

impl Telnet {
    /// A codec for `role`, starting from `settings`; the opening negotiation is already in
    /// [`Telnet::take_out`].
    pub fn new(role: Role, settings: LineSettings) -> Telnet {
        let mut t = Telnet {
            role,
            state: State::Data,
            sub: Vec::new(),
            sub_overflow: false,
            opts: [Opt::default(); 3],
            out: Vec::new(),
            settings,
            outputs: ModemLines {
                valid: ModemLines::DTR | ModemLines::RTS,
                state: ModemLines::DTR | ModemLines::RTS,
            },
            modem_state: 0,
            modem_mask: 0xff,
            agreed: false,
            breaking: false,
            pending: Default::default(),
        };
        for option in [BINARY, SGA, COM_PORT] {
            t.ask(WILL, option);
            t.ask(DO, option);
        }
        t
    }

    /// Bytes to send to the peer (negotiation, answers, commands, escaped data), in order.
    pub fn take_out(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// Whether the peer agreed on RFC 2217 (either direction: some peers answer only one).
    pub fn agreed(&self) -> bool {
        self.agreed
    }

    /// The line settings: as the client last set them (server) or as asked (client).
    pub fn settings(&self) -> LineSettings {
        self.settings
    }

    fn ask(&mut self, verb: u8, option: u8) {
        let o = &mut self.opts[opt_index(option)];
        if verb == WILL {
            o.asked_will = true;
        } else {
            o.asked_do = true;
        }
        self.out.extend_from_slice(&[IAC, verb, option]);
    }

    /// Queues `data` for the peer, `IAC` doubled.
    pub fn send_data(&mut self, data: &[u8]) {
        self.out.reserve(data.len() + data.len() / 64 + 1);
        for &b in data {
            if b == IAC {
                self.out.push(IAC);
            }
            self.out.push(b);
        }
    }

    fn send_sub(&mut self, code: u8, value: &[u8]) {
        let code = match self.role {
            Role::Server => code + SERVER_OFFSET,
            Role::Client => code,
        };
        self.out.extend_from_slice(&[IAC, SB, COM_PORT, code]);
        for &b in value {
            if b == IAC {
                self.out.push(IAC);
            }
            self.out.push(b);
        }
        self.out.extend_from_slice(&[IAC, SE]);
    }

    /// Client role: asks the server for `s` (every field, then the flow control).
    pub fn set_settings(&mut self, s: LineSettings) {
        self.settings = s;
        for (i, v) in [
            s.baud,
            u32::from(s.data_bits),
            u32::from(parity_code(s.parity)),
            u32::from(s.stop_bits),
        ]
        .into_iter()
        .enumerate()
        {
            let q = &mut self.pending[i];
            if q.len() == PENDING_MAX {
                q.pop_front();
            }
            q.push_back(v);
        }
        self.send_sub(cmd::SET_BAUDRATE, &s.baud.to_be_bytes());
        self.send_sub(cmd::SET_DATASIZE, &[s.data_bits]);
        self.send_sub(cmd::SET_PARITY, &[parity_code(s.parity)]);
        self.send_sub(cmd::SET_STOPSIZE, &[s.stop_bits]);
        self.send_sub(cmd::SET_CONTROL, &[flow_code(s.flow)]);
    }

    /// Client role: asks the server for DTR and/or RTS as `m` says (the bits `valid` names).
    pub fn set_outputs(&mut self, m: ModemLines) {
        for (bit, on, off) in [
            (ModemLines::DTR, control::DTR_ON, control::DTR_OFF),
            (ModemLines::RTS, control::RTS_ON, control::RTS_OFF),
        ] {
            if m.valid & bit != 0 {
                let value = if m.state & bit != 0 { on } else { off };
                self.outputs.state = (self.outputs.state & !bit) | (m.state & bit);
                self.send_sub(cmd::SET_CONTROL, &[value]);
            }
        }
    }

    /// Client role: asks the server to hold the line at space (`on`) or to end the break.
    pub fn set_break(&mut self, on: bool) {
        let v = if on {
            control::BREAK_ON
        } else {
            control::BREAK_OFF
        };
        self.send_sub(cmd::SET_CONTROL, &[v]);
    }

    /// Client role: asks the server to purge its buffers (1 received, 2 to send, 3 both).
    pub fn purge(&mut self, which: u8) {
        self.send_sub(cmd::PURGE_DATA, &[which]);
    }

    /// Client role: DTR/RTS as last asked (sent again after a reconnect).
    pub fn outputs(&self) -> ModemLines {
        self.outputs
    }

    /// Server role: the port's CTS/DSR/DCD/RI changed (the bits `m.valid` names); tells the
    /// client when it agreed on RFC 2217 and its mask lets the change through.
    pub fn set_modem(&mut self, m: ModemLines) {
        let mut state = self.modem_state;
        for (bit, rfc) in MODEM_BITS {
            if m.valid & bit != 0 {
                state = (state & !rfc) | if m.state & bit != 0 { rfc } else { 0 };
            }
        }
        let delta = (state ^ self.modem_state) >> 4;
        self.modem_state = state;
        if delta != 0 && self.agreed {
            let v = (state | delta) & self.modem_mask;
            if v != 0 {
                self.send_sub(cmd::NOTIFY_MODEMSTATE, &[v]);
            }
        }
    }

    /// Takes in bytes from the peer: data and what needs acting on go to `notes`, in the
    /// order the peer sent them. Answers are queued for [`Telnet::take_out`].
    pub fn feed(&mut self, input: &[u8], notes: &mut Vec<Note>) {
        let data = |notes: &mut Vec<Note>, b: u8| match notes.last_mut() {
            Some(Note::Data(d)) => d.push(b),
            _ => notes.push(Note::Data(vec![b])),
        };
        for &b in input {
            self.state = match (self.state, b) {
                (State::Data, IAC) => State::Iac,
                (State::Data, b) => {
                    data(notes, b);
                    State::Data
                }
                (State::Iac, IAC) => {
                    data(notes, IAC);
                    State::Data
                }
                (State::Iac, SB) => {
                    self.sub.clear();
                    self.sub_overflow = false;
                    State::Sub
                }
                (State::Iac, v @ (WILL | WONT | DO | DONT)) => State::Negotiate(v),
                // NOP, go-ahead, break, … carry nothing for a serial port.
                (State::Iac, _) => State::Data,
                (State::Negotiate(verb), option) => {
                    self.negotiate(verb, option, notes);
                    State::Data
                }
                (State::Sub, IAC) => State::SubIac,
                (State::Sub, b) => {
                    self.sub_push(b);
                    State::Sub
                }
                (State::SubIac, IAC) => {
                    self.sub_push(IAC);
                    State::Sub
                }
                (State::SubIac, SE) => {
                    let sub = std::mem::take(&mut self.sub);
                    if self.sub_overflow {
                        notes.push(Note::Bad(format!(
                            "a subnegotiation longer than {MAX_SUBNEGOTIATION} bytes, dropped"
                        )));
                    } else {
                        self.subnegotiation(&sub, notes);
                    }
                    self.sub = sub;
                    self.sub.clear();
                    State::Data
                }
                // RFC 855: IAC followed by anything else inside a subnegotiation is an
                // error; treat the IAC as ending it without acting on it.
                (State::SubIac, _) => {
                    notes.push(Note::Bad(
                        "a subnegotiation not ended by IAC SE, dropped".to_string(),
                    ));
                    State::Data
                }
            };
        }
    }

    fn sub_push(&mut self, b: u8) {
        if self.sub.len() < MAX_SUBNEGOTIATION {
            self.sub.push(b);
        } else {
            self.sub_overflow = true;
        }
    }

    fn negotiate(&mut self, verb: u8, option: u8, notes: &mut Vec<Note>) {
        if !supported(option) {
            match verb {
                WILL => self.out.extend_from_slice(&[IAC, DONT, option]),
                DO => self.out.extend_from_slice(&[IAC, WONT, option]),
                _ => {}
            }
            return;
        }
        let i = opt_index(option);
        let o = self.opts[i];
        match verb {
            WILL => {
                self.opts[i].them = true;
                if o.asked_do {
                    self.opts[i].asked_do = false;
                } else if !o.them {
                    self.out.extend_from_slice(&[IAC, DO, option]);
                }
            }
            DO => {
                self.opts[i].us = true;
                if o.asked_will {
                    self.opts[i].asked_will = false;
                } else if !o.us {
                    self.out.extend_from_slice(&[IAC, WILL, option]);
                }
            }
            WONT => {
                self.opts[i].them = false;
                if o.asked_do {
                    self.opts[i].asked_do = false;
                } else if o.them {
                    self.out.extend_from_slice(&[IAC, DONT, option]);
                }
            }
            _ => {
                self.opts[i].us = false;
                if o.asked_will {
                    self.opts[i].asked_will = false;
                } else if o.us {
                    self.out.extend_from_slice(&[IAC, WONT, option]);
                }
            }
        }
        if option == COM_PORT && !self.agreed && (self.opts[i].us || self.opts[i].them) {
            self.agree(Some(notes));
        }
    }

    /// RFC 2217 is in use from now on: a server tells the client its modem state at once
    /// (pyserial's client refuses to report CTS/DSR/… until it has heard it once).
    /// `notes`: where to say so (a negotiation that agreed).
    fn agree(&mut self, notes: Option<&mut Vec<Note>>) {
        self.agreed = true;
        if let Some(notes) = notes {
            notes.push(Note::ComPortAgreed);
        }
        if self.role == Role::Server {
            let v = self.modem_state & self.modem_mask;
            self.send_sub(cmd::NOTIFY_MODEMSTATE, &[v]);
        }
    }

    fn subnegotiation(&mut self, sub: &[u8], notes: &mut Vec<Note>) {
        let [option, code, value @ ..] = sub else {
            notes.push(Note::Bad(format!(
                "a subnegotiation of {} bytes",
                sub.len()
            )));
            return;
        };
        if *option != COM_PORT {
            notes.push(Note::Bad(format!(
                "a subnegotiation for option {option}, not COM-PORT-OPTION (44)"
            )));
            return;
        }
        match self.role {
            Role::Server if *code < SERVER_OFFSET => {
                if !self.agreed {
                    // A client that sends COM-PORT commands uses the option, whatever the
                    // negotiation said. pyserial's reader can take this side's WILL/DO as the
                    // answers to requests its other thread has not sent yet, and then never
                    // sends them: the option never looked agreed here, so pyserial heard no
                    // NOTIFY-MODEMSTATE and failed `remote sends no NOTIFY_MODEMSTATE` (found
                    // with pyserial's test.py, about one open in three).
                    self.agree(None);
                }
                self.server_command(*code, value, notes)
            }
            Role::Client if *code > SERVER_OFFSET => {
                self.client_answer(*code - SERVER_OFFSET, value, notes)
            }
            _ => notes.push(Note::Bad(format!(
                "COM-PORT command {code} is for the other role"
            ))),
        }
    }

    fn server_command(&mut self, code: u8, value: &[u8], notes: &mut Vec<Note>) {
        let before = self.settings;
        self.server_command_inner(code, value, notes);
        if self.settings != before {
            match notes.last_mut() {
                Some(Note::Settings(s)) => *s = self.settings,
                _ => notes.push(Note::Settings(self.settings)),
            }
        }
    }

    fn server_command_inner(&mut self, code: u8, value: &[u8], notes: &mut Vec<Note>) {
        let one = |notes: &mut Vec<Note>, what: &str| -> Option<u8> {
            match value {
                [v] => Some(*v),
                _ => {
                    notes.push(Note::Bad(format!(
                        "{what} with {} value bytes, not 1",
                        value.len()
                    )));
                    None
                }
            }
        };
        match code {
            cmd::SET_BAUDRATE => {
                let Ok(b) = <[u8; 4]>::try_from(value) else {
                    notes.push(Note::Bad(format!(
                        "SET-BAUDRATE with {} value bytes, not 4",
                        value.len()
                    )));
                    return;
                };
                let baud = u32::from_be_bytes(b);
                if baud != 0 {
                    self.settings.baud = baud;
                }
                let v = self.settings.baud.to_be_bytes();
                self.send_sub(code, &v);
            }
            cmd::SET_DATASIZE => {
                let Some(v) = one(notes, "SET-DATASIZE") else {
                    return;
                };
                if (5..=8).contains(&v) {
                    self.settings.data_bits = v;
                }
                let now = self.settings.data_bits;
                self.send_sub(code, &[now]);
            }
            cmd::SET_PARITY => {
                let Some(v) = one(notes, "SET-PARITY") else {
                    return;
                };
                if let Some(p) = parity_of(v) {
                    self.settings.parity = p;
                }
                let now = parity_code(self.settings.parity);
                self.send_sub(code, &[now]);
            }
            cmd::SET_STOPSIZE => {
                let Some(v) = one(notes, "SET-STOPSIZE") else {
                    return;
                };
                if v == 1 || v == 2 {
                    self.settings.stop_bits = v;
                }
                let now = self.settings.stop_bits;
                self.send_sub(code, &[now]);
            }
            cmd::SET_CONTROL => {
                let Some(v) = one(notes, "SET-CONTROL") else {
                    return;
                };
                let answer = match v {
                    control::REQ_FLOW => flow_code(self.settings.flow),
                    control::FLOW_NONE => {
                        self.settings.flow = Flow::None;
                        v
                    }
                    control::FLOW_XONXOFF => {
                        self.settings.flow = Flow::Xonxoff;
                        v
                    }
                    control::FLOW_RTSCTS => {
                        self.settings.flow = Flow::Rtscts;
                        v
                    }
                    control::REQ_BREAK => {
                        if self.breaking {
                            control::BREAK_ON
                        } else {
                            control::BREAK_OFF
                        }
                    }
                    control::BREAK_ON | control::BREAK_OFF => {
                        self.breaking = v == control::BREAK_ON;
                        notes.push(Note::Break(self.breaking));
                        v
                    }
                    control::REQ_DTR => self.output_answer(ModemLines::DTR, control::DTR_ON),
                    control::REQ_RTS => self.output_answer(ModemLines::RTS, control::RTS_ON),
                    control::DTR_ON | control::DTR_OFF | control::RTS_ON | control::RTS_OFF => {
                        let bit = if v <= control::DTR_OFF {
                            ModemLines::DTR
                        } else {
                            ModemLines::RTS
                        };
                        let on = v == control::DTR_ON || v == control::RTS_ON;
                        self.outputs.state = (self.outputs.state & !bit) | if on { bit } else { 0 };
                        notes.push(Note::Modem(ModemLines {
                            valid: bit,
                            state: if on { bit } else { 0 },
                        }));
                        v
                    }
                    // Inbound flow control and DCD/DTR/DSR flow (13..=19): not carried; the
                    // port's own flow control is the one SET-CONTROL 1..=3 chose.
                    13 => 14,
                    14..=19 => v,
                    other => {
                        notes.push(Note::Bad(format!("SET-CONTROL value {other}")));
                        return;
                    }
                };
                self.send_sub(code, &[answer]);
            }
            cmd::NOTIFY_LINESTATE => self.send_sub(code, &[0]),
            cmd::NOTIFY_MODEMSTATE => {
                let v = self.modem_state & self.modem_mask;
                self.send_sub(code, &[v]);
            }
            cmd::FLOW_SUSPEND | cmd::FLOW_RESUME => {}
            cmd::SET_LINESTATE_MASK => {
                if let Some(v) = one(notes, "SET-LINESTATE-MASK") {
                    self.send_sub(code, &[v]);
                }
            }
            cmd::SET_MODEMSTATE_MASK => {
                if let Some(v) = one(notes, "SET-MODEMSTATE-MASK") {
                    self.modem_mask = v;
                    self.send_sub(code, &[v]);
                }
            }
            cmd::PURGE_DATA => {
                if let Some(v) = one(notes, "PURGE-DATA") {
                    if (1..=3).contains(&v) {
                        self.send_sub(code, &[v]);
                        notes.push(Note::Purge(v));
                    } else {
                        notes.push(Note::Bad(format!("PURGE-DATA value {v}")));
                    }
                }
            }
            other => notes.push(Note::Bad(format!("unknown COM-PORT command {other}"))),
        }
    }

    fn output_answer(&self, bit: u8, on: u8) -> u8 {
        if self.outputs.state & bit != 0 {
            on
        } else {
            on + 1
        }
    }

    /// A client's view of the server's answer `got` to a SET of parameter `i`: compared with
    /// the request it answers (the oldest unanswered one), and a refusal is said only when no
    /// newer request for it is on the way (answers crossing a quick change of settings are
    /// not refusals: before, pyserial's test suite changing settings quickly made the device
    /// side warn `the RFC 2217 server set data_bits 7, not 8 as asked`).
    fn answered(&mut self, i: usize, what: &'static str, got: u32, notes: &mut Vec<Note>) {
        let current = [
            self.settings.baud,
            u32::from(self.settings.data_bits),
            u32::from(parity_code(self.settings.parity)),
            u32::from(self.settings.stop_bits),
        ][i];
        let asked = self.pending[i].pop_front().unwrap_or(current);
        if got != asked && self.pending[i].is_empty() {
            notes.push(Note::Refused(what, asked, got));
        }
    }

    fn client_answer(&mut self, code: u8, value: &[u8], notes: &mut Vec<Note>) {
        let byte = value.first().copied();
        match code {
            cmd::SET_BAUDRATE => match <[u8; 4]>::try_from(value) {
                Ok(b) => self.answered(0, "baud", u32::from_be_bytes(b), notes),
                Err(_) => notes.push(Note::Bad("a SET-BAUDRATE answer not 4 bytes".into())),
            },
            cmd::SET_DATASIZE => match byte {
                Some(got) => self.answered(1, "data_bits", u32::from(got), notes),
                None => {
                    self.pending[1].pop_front();
                }
            },
            cmd::SET_PARITY => match byte {
                Some(got) => self.answered(2, "parity", u32::from(got), notes),
                None => {
                    self.pending[2].pop_front();
                }
            },
            cmd::SET_STOPSIZE => match byte {
                Some(got) => self.answered(3, "stop_bits", u32::from(got), notes),
                None => {
                    self.pending[3].pop_front();
                }
            },
            cmd::NOTIFY_MODEMSTATE => match byte {
                Some(v) => {
                    let mut m = ModemLines {
                        valid: ModemLines::CTS | ModemLines::DSR | ModemLines::DCD | ModemLines::RI,
                        state: 0,
                    };
                    for (bit, rfc) in MODEM_BITS {
                        if v & rfc != 0 {
                            m.state |= bit;
                        }
                    }
                    notes.push(Note::Modem(m));
                }
                None => notes.push(Note::Bad("an empty NOTIFY-MODEMSTATE".into())),
            },
            // Answers to SET-CONTROL, masks, purges, line state, flow suspend/resume: nothing
            // to act on.
            _ => {}
        }
    }
}

/// ndd's modem-line bits and RFC 2217's NOTIFY-MODEMSTATE bits.
const MODEM_BITS: [(u8, u8); 4] = [
    (ModemLines::CTS, modem::CTS),
    (ModemLines::DSR, modem::DSR),
    (ModemLines::DCD, modem::CD),
    (ModemLines::RI, modem::RI),
];

/// RFC 2217 parity code (1 none … 5 space).
pub fn parity_code(p: Parity) -> u8 {
    match p {
        Parity::None => 1,
        Parity::Odd => 2,
        Parity::Even => 3,
        Parity::Mark => 4,
        Parity::Space => 5,
    }
}

pub(crate) fn parity_of(code: u8) -> Option<Parity> {
    Some(match code {
        1 => Parity::None,
        2 => Parity::Odd,
        3 => Parity::Even,
        4 => Parity::Mark,
        5 => Parity::Space,
        _ => return None,
    })
}

fn flow_code(f: Flow) -> u8 {
    match f {
        Flow::None => control::FLOW_NONE,
        Flow::Xonxoff => control::FLOW_XONXOFF,
        Flow::Rtscts => control::FLOW_RTSCTS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The data and the other notes of `bytes`.
    fn feed(t: &mut Telnet, bytes: &[u8]) -> (Vec<u8>, Vec<Note>) {
        let mut notes = Vec::new();
        t.feed(bytes, &mut notes);
        let mut data = Vec::new();
        notes.retain(|n| match n {
            Note::Data(d) => {
                data.extend_from_slice(d);
                false
            }
            _ => true,
        });
        (data, notes)
    }

    /// Connects a client and a server in memory until neither has anything to say.
    fn settle(c: &mut Telnet, s: &mut Telnet) -> (Vec<Note>, Vec<Note>) {
        let (mut cn, mut sn) = (Vec::new(), Vec::new());
        for _ in 0..10 {
            let to_s = c.take_out();
            let to_c = s.take_out();
            if to_s.is_empty() && to_c.is_empty() {
                return (cn, sn);
            }
            sn.extend(feed(s, &to_s).1);
            cn.extend(feed(c, &to_c).1);
        }
        panic!("negotiation does not settle");
    }

    #[test]
    fn data_is_escaped_and_unescaped_byte_exact() {
        let all: Vec<u8> = (0..=255u8).chain([255, 255, 0, 255]).collect();
        let mut c = Telnet::new(Role::Client, LineSettings::default());
        let _ = c.take_out();
        c.send_data(&all);
        let wire = c.take_out();
        assert_eq!(wire.len(), all.len() + 4, "each 255 doubled");
        let mut s = Telnet::new(Role::Server, LineSettings::default());
        // Cut anywhere: the parser keeps its state between calls.
        for cut in [0, 1, 255, 256, 257, wire.len()] {
            let (mut d1, n1) = feed(&mut s, &wire[..cut]);
            let (d2, n2) = feed(&mut s, &wire[cut..]);
            d1.extend(d2);
            assert_eq!(d1, all, "cut at {cut}");
            assert!(n1.is_empty() && n2.is_empty());
        }
    }

    #[test]
    fn negotiation_agrees_on_rfc2217_and_settles() {
        let mut c = Telnet::new(Role::Client, LineSettings::default());
        let mut s = Telnet::new(Role::Server, LineSettings::default());
        let (cn, sn) = settle(&mut c, &mut s);
        assert!(c.agreed() && s.agreed());
        assert!(cn.contains(&Note::ComPortAgreed) && sn.contains(&Note::ComPortAgreed));
        // The server told the client its modem state once.
        assert!(cn.iter().any(|n| matches!(n, Note::Modem(_))), "{cn:?}");
    }

    /// pyserial's reader thread may take the server's opening WILL/DO COM-PORT as answers to
    /// its own requests before its main thread sent them, and then sends none: its first
    /// COM-PORT command is the agreement, and the modem state is told at once (then on every
    /// change).
    #[test]
    fn a_client_that_only_sends_commands_hears_the_modem_state() {
        let mut s = Telnet::new(Role::Server, LineSettings::default());
        let _ = s.take_out();
        s.set_modem(ModemLines {
            valid: ModemLines::CTS,
            state: ModemLines::CTS,
        });
        assert!(
            s.take_out().is_empty(),
            "nothing before the option is in use"
        );
        // DO ECHO only, then SET-BAUDRATE 9600.
        let (_, notes) = feed(&mut s, &[IAC, DO, 1]);
        assert!(!notes.contains(&Note::ComPortAgreed));
        let _ = s.take_out();
        let (_, notes) = feed(
            &mut s,
            &[
                IAC,
                SB,
                COM_PORT,
                cmd::SET_BAUDRATE,
                0,
                0,
                0x25,
                0x80,
                IAC,
                SE,
            ],
        );
        assert!(s.agreed(), "{notes:?}");
        let out = s.take_out();
        let notify = [IAC, SB, COM_PORT, cmd::NOTIFY_MODEMSTATE + SERVER_OFFSET];
        assert_eq!(out[..4], notify, "the modem state first: {out:?}");
        s.set_modem(ModemLines {
            valid: ModemLines::CTS,
            state: 0,
        });
        assert_eq!(s.take_out()[..4], notify, "and on a change");
    }

    #[test]
    fn unknown_options_and_echo_are_refused() {
        let mut s = Telnet::new(Role::Server, LineSettings::default());
        let _ = s.take_out();
        let _ = feed(&mut s, &[IAC, DO, ECHO, IAC, WILL, 24, IAC, DO, 31]);
        assert_eq!(
            s.take_out(),
            [IAC, WONT, ECHO, IAC, DONT, 24, IAC, WONT, 31]
        );
    }

    #[test]
    fn break_and_purge_travel_from_the_client_to_the_server() {
        let mut c = Telnet::new(Role::Client, LineSettings::default());
        let mut s = Telnet::new(Role::Server, LineSettings::default());
        settle(&mut c, &mut s);
        c.set_break(true);
        assert_eq!(
            c.take_out(),
            [
                IAC,
                SB,
                COM_PORT,
                cmd::SET_CONTROL,
                control::BREAK_ON,
                IAC,
                SE
            ]
        );
        c.set_break(true);
        c.purge(3);
        c.set_break(false);
        let (_, notes) = feed(&mut s, &c.take_out());
        assert_eq!(
            notes,
            vec![Note::Break(true), Note::Purge(3), Note::Break(false)]
        );
        // Each answered as asked (server codes are +100); the client takes the answers quietly.
        let answers = s.take_out();
        assert_eq!(
            &answers[..7],
            [
                IAC,
                SB,
                COM_PORT,
                cmd::SET_CONTROL + SERVER_OFFSET,
                control::BREAK_ON,
                IAC,
                SE
            ]
        );
        let (_, cn) = feed(&mut c, &answers);
        assert!(cn.is_empty(), "{cn:?}");
        // A purge value out of range is reported, not carried.
        let (_, notes) = feed(&mut s, &[IAC, SB, COM_PORT, cmd::PURGE_DATA, 4, IAC, SE]);
        assert_eq!(notes, vec![Note::Bad("PURGE-DATA value 4".into())]);
    }

    #[test]
    fn the_server_answers_every_set_and_reports_settings_once() {
        let mut s = Telnet::new(Role::Server, LineSettings::default());
        let _ = s.take_out();
        let mut c = Telnet::new(Role::Client, LineSettings::default());
        let _ = c.take_out();
        let want = LineSettings {
            baud: 57_600,
            data_bits: 7,
            parity: Parity::Even,
            stop_bits: 2,
            flow: Flow::Rtscts,
        };
        c.set_settings(want);
        let (_, notes) = feed(&mut s, &c.take_out());
        assert_eq!(notes, vec![Note::Settings(want)]);
        // The answers, as the client sees them: no refusal (the modem state first: the
        // server tells it with its first answer).
        let (_, cn) = feed(&mut c, &s.take_out());
        assert!(matches!(&cn[..], [Note::Modem(_)]), "{cn:?}");
    }

    #[test]
    fn settings_keep_their_place_between_data() {
        let mut s = Telnet::new(Role::Server, LineSettings::default());
        let mut c = Telnet::new(Role::Client, LineSettings::default());
        let _ = (s.take_out(), c.take_out());
        c.send_data(b"old");
        let new = LineSettings {
            baud: 9600,
            ..LineSettings::default()
        };
        c.set_settings(new);
        c.send_data(b"new");
        let mut notes = Vec::new();
        s.feed(&c.take_out(), &mut notes);
        assert_eq!(
            notes,
            vec![
                Note::Data(b"old".to_vec()),
                Note::Settings(new),
                Note::Data(b"new".to_vec())
            ]
        );
    }

    #[test]
    fn answers_crossing_a_quick_change_of_settings_are_not_refusals() {
        let mut s = Telnet::new(Role::Server, LineSettings::default());
        let _ = s.take_out();
        let mut c = Telnet::new(Role::Client, LineSettings::default());
        let _ = c.take_out();
        // 7E1 then, before any answer, 8N1: the server answers both in turn.
        c.set_settings(LineSettings {
            data_bits: 7,
            parity: Parity::Even,
            ..LineSettings::default()
        });
        c.set_settings(LineSettings::default());
        let _ = feed(&mut s, &c.take_out());
        let (_, mut cn) = feed(&mut c, &s.take_out());
        cn.retain(|n| !matches!(n, Note::Modem(_)));
        assert!(
            cn.is_empty(),
            "answers to the first request taken for refusals: {cn:?}"
        );
        // A refusal of the newest request is still said, with what that request asked.
        c.set_settings(LineSettings {
            data_bits: 9,
            ..LineSettings::default()
        });
        let _ = feed(&mut s, &c.take_out());
        let (_, mut cn) = feed(&mut c, &s.take_out());
        cn.retain(|n| !matches!(n, Note::Modem(_)));
        assert_eq!(cn, vec![Note::Refused("data_bits", 9, 8)]);
    }

    #[test]
    fn out_of_range_values_are_answered_with_what_holds() {
        let mut s = Telnet::new(Role::Server, LineSettings::default());
        let _ = s.take_out();
        let mut c = Telnet::new(Role::Client, LineSettings::default());
        let _ = c.take_out();
        c.set_settings(LineSettings {
            data_bits: 9,
            stop_bits: 3,
            ..LineSettings::default()
        });
        let (_, notes) = feed(&mut s, &c.take_out());
        assert!(notes.is_empty(), "nothing changed: {notes:?}");
        let (_, mut cn) = feed(&mut c, &s.take_out());
        cn.retain(|n| !matches!(n, Note::Modem(_)));
        assert_eq!(
            cn,
            vec![
                Note::Refused("data_bits", 9, 8),
                Note::Refused("stop_bits", 3, 1)
            ]
        );
    }

    #[test]
    fn dtr_rts_travel_to_the_server_and_modem_state_back() {
        let mut c = Telnet::new(Role::Client, LineSettings::default());
        let mut s = Telnet::new(Role::Server, LineSettings::default());
        let _ = settle(&mut c, &mut s);
        c.set_outputs(ModemLines {
            valid: ModemLines::RTS | ModemLines::DTR,
            state: ModemLines::DTR,
        });
        let (_, notes) = feed(&mut s, &c.take_out());
        assert_eq!(
            notes,
            vec![
                Note::Modem(ModemLines {
                    valid: ModemLines::DTR,
                    state: ModemLines::DTR
                }),
                Note::Modem(ModemLines {
                    valid: ModemLines::RTS,
                    state: 0
                }),
            ]
        );
        s.set_modem(ModemLines {
            valid: ModemLines::CTS | ModemLines::DCD,
            state: ModemLines::CTS,
        });
        let (_, cn) = feed(&mut c, &s.take_out());
        assert_eq!(
            cn,
            vec![Note::Modem(ModemLines {
                valid: ModemLines::CTS | ModemLines::DSR | ModemLines::DCD | ModemLines::RI,
                state: ModemLines::CTS
            })]
        );
        // No change, no notification.
        s.set_modem(ModemLines {
            valid: ModemLines::CTS,
            state: ModemLines::CTS,
        });
        assert!(s.take_out().is_empty());
    }

    #[test]
    fn garbage_never_panics_and_is_reported() {
        let mut s = Telnet::new(Role::Server, LineSettings::default());
        let mut long = vec![IAC, SB, COM_PORT, 1];
        long.extend(std::iter::repeat_n(7, 1000));
        long.extend([IAC, SE]);
        let (_, notes) = feed(&mut s, &long);
        assert!(matches!(&notes[..], [Note::Bad(m)] if m.contains("longer than")));
        let (_, notes) = feed(&mut s, &[IAC, SB, COM_PORT, 1, 0, IAC, SE]);
        assert!(matches!(&notes[..], [Note::Bad(m)] if m.contains("not 4")));
        // An empty subnegotiation; one for another option; one cut by a stray command.
        let (_, notes) = feed(
            &mut s,
            &[
                IAC, SB, IAC, SE, IAC, SB, 9, 9, IAC, SE, IAC, SB, 44, IAC, 7,
            ],
        );
        assert_eq!(notes.len(), 3, "{notes:?}");
        assert!(notes.iter().all(|n| matches!(n, Note::Bad(_))));
        // A pseudo-random stream: no panic, and the parser still works afterwards.
        let mut x = 0x1234_5678u32;
        let noise: Vec<u8> = (0..20_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x >> 3) as u8
            })
            .collect();
        let _ = feed(&mut s, &noise);
        // Ends whatever state the noise left: a subnegotiation, a command, a negotiation.
        let _ = feed(&mut s, &[IAC, SE, IAC, SE]);
        let (data, _) = feed(&mut s, b"ok");
        assert!(data.ends_with(b"ok"));
    }
}
