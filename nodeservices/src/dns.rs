//! Cluster DNS on the node's address, port 53: Service names
//! (`name.namespace.svc.<domain>`) answer with their cluster IP, headless ones
//! with the ready addresses of their EndpointSlices; every other name is
//! NXDOMAIN at once. The test machine has no network: the node's DNS is the whole
//! world the Pods see, and a fast negative answer is what lets a mail server's SPF
//! and DMARC checks finish (as with an empty root zone) rather than time out.

use std::net::Ipv4Addr;
use std::sync::Arc;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{Name, RData, Record, RecordType, rdata::A, rdata::SOA};

use crate::hosts::Hosts;

pub async fn serve(addr: Ipv4Addr, hosts: Arc<Hosts>) {
    let socket = match tokio::net::UdpSocket::bind((addr, 53)).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("cluster DNS: bind {addr}:53: {e}");
            return;
        }
    };
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, peer)) = socket.recv_from(&mut buf).await else { continue };
        let reply = match answer(&buf[..n], &hosts) {
            Ok(r) => r,
            Err(e) => {
                // Never silence: a resolver left without an answer waits out its
                // timeout, which is what a mail server's DNS budget then reports.
                tracing::warn!(%peer, "cluster DNS: cannot answer a query: {e}");
                let Some(reply) = refusal(&buf[..n]) else { continue };
                reply
            }
        };
        if let Err(e) = socket.send_to(&reply, peer).await {
            tracing::warn!(%peer, "cluster DNS: send: {e}");
        }
    }
}

/// SERVFAIL with the query's id, for a query that could not be read or answered.
fn refusal(query: &[u8]) -> Option<Vec<u8>> {
    let id = u16::from_be_bytes([*query.first()?, *query.get(1)?]);
    Message::error_msg(id, OpCode::Query, ResponseCode::ServFail).to_vec().ok()
}

fn answer(query: &[u8], hosts: &Hosts) -> anyhow::Result<Vec<u8>> {
    let q = Message::from_vec(query)?;
    let mut r = Message::new(q.metadata.id, MessageType::Response, OpCode::Query);
    r.metadata.recursion_desired = q.metadata.recursion_desired;
    r.metadata.authoritative = true;
    let Some(question) = q.queries.first().cloned() else {
        r.metadata.response_code = ResponseCode::FormErr;
        return Ok(r.to_vec()?);
    };
    let name = question.name().clone();
    r.add_query(question.clone());
    match hosts.lookup(&name.to_ascii()) {
        Some(ips) => {
            if question.query_type() == RecordType::A {
                for ip in ips {
                    r.add_answer(Record::from_rdata(name.clone(), 5, RData::A(A(ip))));
                }
            }
        }
        None => {
            r.metadata.response_code = ResponseCode::NXDomain;
            // The SOA of the (empty) root zone: its minimum is how long resolvers
            // may cache the negative answer (RFC 2308), as they would from a real one.
            let soa = SOA::new(
                Name::from_ascii("ns.cluster.")?,
                Name::from_ascii("hostmaster.cluster.")?,
                1,
                3600,
                600,
                86400,
                30,
            );
            r.authorities.push(Record::from_rdata(Name::root(), 30, RData::SOA(soa)));
        }
    }
    tracing::debug!(name = %name, qtype = %question.query_type(), code = ?r.metadata.response_code, "cluster DNS");
    Ok(r.to_vec()?)
}
